"""Multi-objective mode (`objective: pareto`): generation tok/s, prompt tok/s and peak memory, and the front of
configurations that no other beats on all three. Export picks from the front for a memory budget.

The front is computed from the stored samples (medians), so it can be shown for any study, and is also kept on the
study (StudyRecord.pareto_front: trial numbers) after every trial.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import Campaign, stored_campaign
from autoinfer.engines.base import Measurement
from autoinfer.errors import UserError
from autoinfer.store import trials as store
from autoinfer.store.records import Confirmation, TrialRecord
from autoinfer.store.trials import Store

DIRECTIONS = ("maximize", "maximize", "minimize")  # tg tok/s, pp tok/s, peak MiB
PICK_OBJECTIVES = ("tg", "pp", "balanced")
PROMPT_TG_LOSS = 0.05  # a prompt-faster alternative gives up at most this share of the recommendation's tg
PROMPT_GAIN = 1.5  # and runs the prompt at least this many times as fast
SEARCH_SOURCE, CONFIRMATION_SOURCE = "the search's runs", "the confirmation's interleaved runs"  # whose medians


def enabled(campaign: Campaign) -> bool:
    return campaign.objective == "pareto"


def directions(campaign: Campaign) -> list[str]:
    return list(DIRECTIONS) if enabled(campaign) else ["maximize"]


def peak_mib(vram: float | None, rss: float | None) -> float | None:
    """The memory objective: device memory where it was measured, else RAM (CPU-only builds)."""
    return vram if vram else rss


def values(m: Measurement) -> list[float]:
    """Objective values of one successful measurement, in DIRECTIONS order (missing ones are 0)."""
    return [m.tg or 0.0, m.pp or 0.0, peak_mib(m.vram_peak_mib, m.rss_peak_mib) or 0.0]


@dataclass(frozen=True)
class Point:
    trial: TrialRecord
    tg: float
    pp: float
    mem_mib: float

    def dominates(self, other: "Point") -> bool:
        ge = self.tg >= other.tg and self.pp >= other.pp and self.mem_mib <= other.mem_mib
        return ge and (self.tg > other.tg or self.pp > other.pp or self.mem_mib < other.mem_mib)


def points(study: optuna.Study) -> list[Point]:
    out = []
    for t in Store(study).records(states=(TrialState.COMPLETE,)):
        if not t.is_feasible_ok:
            continue
        tg, pp = t.samples("tg"), t.samples("pp")
        mem = peak_mib(t.vram_peak_mib, t.rss_peak_mib)
        if mem is None:
            continue
        out.append(Point(t, statistics.median(tg) if tg else 0.0, statistics.median(pp) if pp else 0.0, float(mem)))
    return out


def configurations(study: optuna.Study, leave_out: set[int] | frozenset[int] = frozenset()) -> list[tuple[Point, list[int]]]:
    """Each configuration once, as the recommendation judges it: the medians of the samples of all its feasible
    successful trials (but those left out), its largest peak and its first trial; with all its trial numbers."""
    groups: dict[str, list[TrialRecord]] = {}
    for p in points(study):
        if p.trial.number not in leave_out:
            groups.setdefault(json.dumps(p.trial.params, sort_keys=True, default=str), []).append(p.trial)
    out = []
    for trials in groups.values():
        trials.sort(key=lambda t: t.number)
        tg = [v for t in trials for v in t.samples("tg")]
        pp = [v for t in trials for v in t.samples("pp")]
        mem = max(peak_mib(t.vram_peak_mib, t.rss_peak_mib) for t in trials)
        out.append((Point(trials[0], statistics.median(tg) if tg else 0.0, statistics.median(pp) if pp else 0.0,
                          float(mem)), [t.number for t in trials]))
    return out


def front(study: optuna.Study) -> list[Point]:
    """Non-dominated feasible successful trials, by ascending memory."""
    pts = points(study)
    return sorted((p for p in pts if not any(q.dominates(p) for q in pts)), key=lambda p: p.mem_mib)


def tg_pp_front(pts: list[Point], budget_mib: float | None) -> list[Point]:
    """Points within the memory budget that no other within it beats on both tg and pp (memory aside: all of them
    fit), fastest generation first; the choice a workload's tg:pp weight makes."""
    fit = [p for p in pts if budget_mib is None or p.mem_mib <= budget_mib]

    def beaten(p: Point) -> bool:
        return any(q.tg >= p.tg and q.pp >= p.pp and (q.tg > p.tg or q.pp > p.pp) for q in fit)

    return sorted((p for p in fit if not beaten(p)), key=lambda p: -p.tg)


def pp_weights(pts: list[Point], steps: int = 1000) -> dict[int, tuple[float, float]]:
    """For each point (trial number), the prompt weights w in [0, 1] for which it scores best on
    tg^(1-w) · pp^w (the campaign objective {tg: 1-w, pp: w}), as (lowest, highest) on a grid of `steps`; points
    best for no weight are left out (inside the front's hull)."""
    out: dict[int, tuple[float, float]] = {}
    usable = [p for p in pts if p.tg > 0 and p.pp > 0]
    for i in range(steps + 1):
        w = i / steps
        best = max(usable, key=lambda p: (1 - w) * math.log(p.tg) + w * math.log(p.pp), default=None)
        if best is not None:
            low, _ = out.get(best.trial.number, (w, w))
            out[best.trial.number] = (low, w)
    return out


@dataclass(frozen=True)
class PromptAlternative:
    """A configuration measured at almost the recommendation's generation speed whose prompt ran far faster."""

    trial: int
    tg: float
    pp: float
    recommended_tg: float
    recommended_pp: float
    source: str = SEARCH_SOURCE

    def line(self) -> str:
        change = self.tg / self.recommended_tg - 1
        return (f"prompt-faster alternative: trial {self.trial}, tg {self.tg:.1f} against {self.recommended_tg:.1f} "
                f"({abs(change):.0%} {'faster' if change > 0 else 'slower'}), pp {self.pp:.0f} against "
                f"{self.recommended_pp:.0f} ({self.pp / self.recommended_pp:.1f}x), the medians of {self.source}; "
                "an objective with a prompt weight chooses between them")


def _confirmed_medians(confirmation: Confirmation | None, trials: list[int]) -> tuple[float, float] | None:
    """tg and pp of a configuration as the confirmation measured it, the medians over its fresh processes as the
    recommendation's lines count them (None: it was no finalist)."""
    if confirmation is None:
        return None
    tg, pp = confirmation.run_medians(trials, "tg"), confirmation.run_medians(trials, "pp")
    return (statistics.median(tg), statistics.median(pp)) if tg and pp else None


def prompt_alternative(study: optuna.Study, recommended: int) -> PromptAlternative | None:
    """For an objective without a prompt weight: the configuration within PROMPT_TG_LOSS of the recommendation's
    generation speed whose prompt ran fastest, at least PROMPT_GAIN times the recommendation's (None: there is none,
    or the objective weighs the prompt).
    On an H100 at 12 GiB a tg-only sweep recommended its placement with mmap, which the confirmation could not tell
    apart from the same placement without it (1.03 ± 0.14), at a fifth of that one's prompt speed (296 against 1443
    tok/s in the search, benchmarks/results/vs-fit-h100.md): the objective decides, and the line says what it cost.
    Drift-flagged trials are left out, as the confirmation leaves them out of its finalists and the report out of
    its front. A configuration the confirmation measured beside the recommendation is judged by the confirmation's
    runs: by the search's medians the first run's alternative ran 2% faster than the recommendation, which the
    confirmation had measured 1.03 ± 0.04 times faster than it. Any other is judged by the search's medians, which can
    put it above the recommendation: on an H200 at 12 GiB the line offered one at 4% above the recommendation's
    generation speed (then printed as "-4% slower"; benchmarks/results/vs-fit-h200.md)."""
    campaign = stored_campaign(study)
    if campaign is not None and campaign.objective_weights().get("pp"):
        return None
    configs = configurations(study, store.flagged_trials(study))
    chosen = next(((p, numbers) for p, numbers in configs if recommended in numbers), None)
    if chosen is None or chosen[0].tg <= 0 or chosen[0].pp <= 0:
        return None
    point, trials = chosen
    confirmation = Store(study).study_record().confirmed
    chosen_confirmed = _confirmed_medians(confirmation, trials)
    candidates = []
    for p, numbers in configs:
        both = chosen_confirmed and _confirmed_medians(confirmation, numbers)
        if both:
            (tg, pp), (ref_tg, ref_pp), source = both, chosen_confirmed, CONFIRMATION_SOURCE
        else:
            (tg, pp), (ref_tg, ref_pp), source = (p.tg, p.pp), (point.tg, point.pp), SEARCH_SOURCE
        if tg >= ref_tg * (1 - PROMPT_TG_LOSS) and pp >= ref_pp * PROMPT_GAIN:
            candidates.append(PromptAlternative(p.trial.number, tg, pp, ref_tg, ref_pp, source))
    return max(candidates, key=lambda a: a.pp / a.recommended_pp, default=None)


def remember(study: optuna.Study) -> None:
    """Store the current front's trial numbers on the study."""
    Store(study).write_study(pareto_front=tuple(p.trial.number for p in front(study)))


def pick(study: optuna.Study, budget_mib: float | None, objective: str) -> store.Best:
    """The front's best configuration for an objective within a memory budget."""
    if objective not in PICK_OBJECTIVES:
        raise UserError(f"--objective {objective!r} is not one of {', '.join(PICK_OBJECTIVES)}")
    candidates = [p for p in front(study) if budget_mib is None or p.mem_mib <= budget_mib]
    if not candidates:
        smallest = min((p.mem_mib for p in points(study)), default=None)
        hint = f"; the smallest measured peak is {smallest:.0f} MiB" if smallest is not None else ""
        raise UserError(f"no feasible trial of study {study.study_name!r} fits in {budget_mib:.0f} MiB{hint}"
                        if budget_mib is not None else f"study {study.study_name!r} has no feasible trial yet")

    def score(p: Point) -> float:
        if objective == "balanced":
            return math.sqrt(max(p.tg, 1e-9) * max(p.pp, 1e-9))
        return p.tg if objective == "tg" else p.pp

    best = max(candidates, key=score)
    return store.Best(best.trial, best.trial.trial_config, score(best))
