"""The recommended configuration of a study: the one answer that the progress bar ("best so far"), the end-of-sweep
summary, `status`, `export`, the analysis report and the notebooks all give.

A single trial is one process's measurement, and a process can land in a fast or a slow mode of the machine, so a
configuration is judged on all of its trustworthy measurements together: its trials not flagged by the drift
anchor (tagged re-measurements included) and the anchor's own good runs when the anchor is that configuration. Its
speed is the median of those runs' objective values. The interleaved confirmation, when it ran, decides; unless
most of its finalists measured more than CONTRADICTION× away from every search run of the same configuration (a
process lands up to ±40% off on a small VM; beyond twice that the machine was in another state, as when another
program loaded it during the confirmation): then the search's answer stands, with the reason said.

The logic takes plain inputs (Run, the Confirmation record) so it does not depend on how trials are stored.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import stored_campaign
from autoinfer.measure.stats import bootstrap_ci
from autoinfer.store import trials as store
from autoinfer.store.records import Alternative, Confirmation, DriftState, TrialRecord
from autoinfer.store.trials import Store
from autoinfer.sweep.confirm import config_key, counted_memory, lighter_alternative, memory_of
from autoinfer.sweep.drift import busy_verdict

CONTRADICTION = 2.0  # a confirmed median this many times off every search run of its configuration contradicts them


@dataclass(frozen=True)
class Run:
    """One trustworthy measurement of a configuration: a trial (`trial` set) or a drift-anchor run (None)."""

    config_key: str
    score: float
    trial: int | None = None
    memory_mib: float | None = None
    memory_kind: str = "none"
    samples: tuple[float, ...] = ()  # the objective's samples when it is one kind (tg or pp), for a one-run CI
    context_mib: float | None = None  # what the serving context adds to memory_mib (TrialRecord.context_mib)


@dataclass(frozen=True)
class Recommendation:
    trial: int
    config: Mapping[str, Any]
    speed: float  # the objective: tok/s for a single-kind objective
    ci: tuple[float, float] | None  # 95% bootstrap interval of the median over `runs` (one run: over its samples)
    runs: int  # measurements behind `speed`
    memory_mib: float | None
    memory_kind: str  # vram | rss | none
    confirmed: bool
    why: str
    alternative: Alternative | None = None
    busy: str | None = None  # the machine-noise verdict, when the machine's own noise dominated the study

    unit: str = ""  # "tok/s" when the objective is one kind of speed; else the objective is a weighted score
    context_mib: float | None = None  # what the serving context adds to memory_mib as the budget counts it

    def label(self) -> str:
        """The progress bar's text."""
        return f"best so far {self.speed:.2f}{' ' + self.unit if self.unit else ''} (trial {self.trial})"

    def headline(self) -> str:
        ci = f", 95% CI {self.ci[0]:.2f}–{self.ci[1]:.2f}" if self.ci else ""
        memory = f", {self.memory_kind} {self.memory_mib:.0f} MiB" if self.memory_mib is not None else ""
        if memory and self.context_mib:
            memory += f" + {self.context_mib:.0f} at the serving context"
        return (f"recommended: trial {self.trial}, {self.speed:.2f}{' ' + self.unit if self.unit else ''} (median "
                f"of {self.runs} run(s){ci}{memory}); {self.why}")


def runs_of(trials: Iterable[TrialRecord], weights: dict[str, float], flagged: set[int],
            anchor: DriftState | None = None, side: str | None = None) -> list[Run]:
    """The trustworthy measurements of a study: measured feasible successful trials not flagged by the drift anchor,
    and the anchor's runs that did not drift (from its state); each trial's memory on the budget's `side`
    (confirm.memory_of)."""
    single = [k for k in weights if k != "kld"]
    kind = single[0] if len(single) == 1 and len(weights) == 1 else None
    out = []
    for t in trials:
        if t.number in flagged or not t.is_finished or not t.is_feasible_ok:
            continue
        value = store.score({"tg": t.samples("tg"), "pp": t.samples("pp"), "kld": t.kld_samples}, weights)
        if value is not None:
            mem, mem_kind = memory_of([t.vram_peak_mib] if t.vram_peak_mib else [],
                                      [t.rss_peak_mib] if t.rss_peak_mib else [], side)
            out.append(Run(config_key(t.config), value, t.number, mem, mem_kind,
                           tuple(t.samples(kind)) if kind else (), t.context_mib if mem is not None else None))
    if anchor and anchor.config:
        key = config_key(anchor.config)
        out += [Run(key, a.score) for a in anchor.anchors
                if a.score is not None and (not a.drifted or a.rebased) and a.trial is None and not a.discarded]
    return out


@dataclass(frozen=True)
class _Config:
    key: str
    trial: int  # the trial that stands for the configuration: the one nearest its median
    speed: float
    scores: tuple[float, ...]
    samples: tuple[float, ...]
    memory_mib: float | None
    memory_kind: str
    context_mib: float | None


def _configs(runs: Sequence[Run]) -> list[_Config]:
    """Configurations that have a trial, fastest median first."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.config_key].append(r)
    out = []
    for key, group in groups.items():
        trials = [r for r in group if r.trial is not None]
        if not trials:
            continue
        scores = tuple(r.score for r in group)
        speed = statistics.median(scores)
        stand = min(trials, key=lambda r: (abs(r.score - speed), r.trial))
        mems = [r.memory_mib for r in trials if r.memory_mib is not None]
        out.append(_Config(key, stand.trial, speed, scores, tuple(v for r in group for v in r.samples),
                           statistics.median(mems) if mems else None, stand.memory_kind, stand.context_mib))
    return sorted(out, key=lambda c: (-c.speed, c.trial))


def _ci(config: _Config) -> tuple[float, float] | None:
    """Over the runs' scores; a single run's over its samples (the score is their median then)."""
    if len(config.scores) >= 2:
        return bootstrap_ci(config.scores)
    return bootstrap_ci(config.samples) if len(config.samples) >= 2 else None


def contradicted(record: Confirmation, configs: Sequence[_Config], keys: dict[int, str]) -> list[int]:
    """Finalists whose confirmed median lies more than CONTRADICTION× away from all of their search measurements."""
    by_key = {c.key: c for c in configs}
    out = []
    for f in record.finalists:
        own = by_key.get(keys.get(f.trial, ""))
        if f.median is None or own is None:
            continue
        if not min(own.scores) / CONTRADICTION <= f.median <= max(own.scores) * CONTRADICTION:
            out.append(f.trial)
    return out


def decide(runs: Sequence[Run], record: Confirmation | None, keys: dict[int, str],
           configs_of: dict[int, Mapping[str, Any]], *, memory_tolerance: float = 0.02,
           busy: str | None = None, unit: str = "") -> Recommendation | None:
    """The recommendation from plain inputs: the trustworthy runs, the confirmation record (or None), each trial's
    configuration key and configuration."""
    configs = _configs(runs)
    if record and record.verdict.recommended is not None:
        against = contradicted(record, configs, keys)
        judged = [f for f in record.finalists if f.median is not None]
        if len(against) * 2 <= len(judged):
            rec = record.finalist(record.verdict.recommended)
            return Recommendation(
                rec.trial, configs_of[rec.trial], rec.median, rec.ci, len(rec.scores), rec.memory_mib,
                rec.memory_kind, True, record.verdict.why or "confirmed by interleaved re-measurement",
                record.verdict.alternative, busy, unit, rec.context_mib)
        why_not = (f"the confirmation was not used: {len(against)} of {len(judged)} finalists measured more than "
                   f"{CONTRADICTION:g}× away from all of their own search runs, so the machine was in another state "
                   "while it ran; ")
    else:
        why_not = "not confirmed; " if record is None else "the confirmation had no winner; "
    if not configs:
        return None
    top = configs[0]
    counted = {c.trial: counted_memory(c.memory_mib, c.context_mib) for c in configs}
    alt = lighter_alternative({c.trial: c.speed for c in configs}, counted, top.trial, memory_tolerance,
                              {c.trial: c.context_mib for c in configs if c.context_mib})
    return Recommendation(
        top.trial, configs_of[top.trial], top.speed, _ci(top), len(top.scores), top.memory_mib,
        top.memory_kind, False,
        why_not + f"fastest median of {len(configs)} configuration(s) over their trustworthy runs "
        "(drift-flagged trials left out)", alt, busy, unit, top.context_mib)


def recommend(study: optuna.Study) -> Recommendation | None:
    """The study's recommended configuration (None while no feasible successful trial exists)."""
    campaign = stored_campaign(study)
    weights = campaign.objective_weights() if campaign else {"tg": 1.0}
    study_store = Store(study)
    trials = study_store.records(states=(TrialState.COMPLETE,))
    kept = study_store.study_record()
    runs = runs_of(trials, weights, set(kept.drift_flagged), kept.drift,
                   campaign.constraints.side if campaign else None)
    return decide(runs, kept.confirmed,
                  {t.number: config_key(t.config) for t in trials if t.config is not None},
                  {t.number: t.config for t in trials if t.config is not None},
                  memory_tolerance=campaign.confirm.memory_tolerance if campaign else 0.02,
                  busy=busy_verdict(study), unit="tok/s" if set(weights) in ({"tg"}, {"pp"}) else "")


def as_best(study: optuna.Study, rec: Recommendation | None) -> store.Best | None:
    """The recommendation in the form the exporters render."""
    if rec is None:
        return None
    study_store = Store(study)
    t = study_store.record(rec.trial)
    confirmation = study_store.study_record().confirmed if rec.confirmed else None
    return store.Best(t, t.trial_config, rec.speed, confirmation=confirmation)
