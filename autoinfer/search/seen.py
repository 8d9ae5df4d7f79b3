"""The study's finished trials as the boundary search reasons about them: one Seen per trial, the samples of every
measurement of one configuration pooled into its score, and the peak on the budget's side."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autoinfer.engines.base import TrialConfig
from autoinfer.store import trials as store
from autoinfer.store.records import TrialRecord


@dataclass(frozen=True)
class Seen:
    """A trial as the strategy uses it."""

    number: int
    params: dict[str, Any]
    score: float | None  # the objective, for a feasible OK trial
    fits: bool | None  # measured (or confidently predicted) within the budget; None: not known
    predicted_mib: float | None  # the memory model's prediction when the trial was chosen
    config: TrialConfig | None
    tg: float | None = None  # medians of an OK trial
    pp: float | None = None
    reason: str = ""
    runs: int = 1  # measured trials of this configuration whose samples the score pools
    log_var: float | None = None  # variance of log(score) from the pooled samples' spread (None: too few)
    evidence: float | None = None  # what the models learn from: the score, or a pruned trial's first repetition
    peak_mib: float | None = None  # the measured peak on the budget's side
    stand_in: bool = False  # its numbers are another configuration's (Measurement.stand_in): no model learns from it


def seen_trials(records: list[TrialRecord], budget_mib: float | None, side: str, objective: dict[str, float],
                weights: dict[str, float]) -> list[Seen]:
    """The finished ones of a study's trials; the score, tg and pp of a configuration measured more than once pool
    the samples of all its successful trials. `objective`: the campaign's weights; `weights`: its tg and pp ones."""
    out = []
    # a baseline running llama-fit-params' own overrides is not the placement its parameters name
    trials = [t for t in records if t.state.is_finished() and not t.stale and t.params
              and t.fit_override_tensors is None]
    pooled: dict[str, dict[str, list[float]]] = {}
    runs: dict[str, int] = {}
    for t in trials:
        if t.is_feasible_ok:
            key = config_key(t.params)
            samples = pooled.setdefault(key, {"tg": [], "pp": [], "kld": []})
            samples["tg"] += t.samples("tg")
            samples["pp"] += t.samples("pp")
            samples["kld"] += t.kld_samples
            runs[key] = runs.get(key, 0) + 1
    for t in trials:
        outcome = t.outcome
        config = t.trial_config if t.config is not None else None
        samples = pooled.get(config_key(t.params)) if t.is_feasible_ok else None
        score = store.score(samples, objective) if samples else None
        peak = None if t.stand_in else peak_of(t, side)
        if t.stand_in:  # another configuration's peak: says nothing of this one's
            fits = None
        elif outcome in ("oom", "infeasible", "predicted_infeasible"):
            fits = False
        elif outcome in ("ok", "pruned") and peak and budget_mib is not None:
            fits = peak <= budget_mib
        else:
            fits = None
        evidence = score
        if outcome == "pruned" and fits is not False:  # cut after a first repetition far below the best
            samples = {k: t.samples(k) for k in ("tg", "pp")}
            evidence = store.score(samples, objective)
        tg, pp = (statistics.median(samples[k]) if samples and samples[k] else None for k in ("tg", "pp"))
        out.append(Seen(t.number, dict(t.params), score, fits, t.predicted_mib, config, tg, pp,
                        str(t.search_reason or ""), runs.get(config_key(t.params), 1),
                        log_var(samples, weights) if samples else None, evidence, peak or None, t.stand_in))
    return out


def peak_of(t: TrialRecord, side: str) -> float | None:
    """A trial's peak as the budget on `side` holds it (TrialRecord.budget_peak)."""
    return t.budget_peak(side)


def log_var(samples: dict[str, list[float]], weights: dict[str, float]) -> float | None:
    """Variance of the log score from the samples' spread (of a mean; the median is close enough)."""
    total = 0.0
    for kind, w in weights.items():
        values = [v for v in samples.get(kind) or [] if v > 0]
        if len(values) < 2:
            return None
        total += w * w * statistics.variance([math.log(v) for v in values]) / len(values)
    return total


def configurations(seen: list[Seen]) -> list[Seen]:
    """One Seen per configuration the models can learn from: its pooled score where a trial of it succeeded, else a
    pruned trial's first repetition; not one whose numbers stand in for it."""
    out: dict[str, Seen] = {}
    for s in seen:
        if s.evidence is not None and s.config is not None and not s.stand_in:
            kept = out.get(config_key(s.params))
            if kept is None or (kept.score is None and s.score is not None):
                out[config_key(s.params)] = s
    return list(out.values())


def config_key(params: dict[str, Any]) -> str:
    """A configuration's identity among the trials (its searched parameters)."""
    return json.dumps(params, sort_keys=True, default=str)
