"""Final re-measurement: the winner is chosen on fresh, interleaved runs of the top configurations, not on the
luckiest trial of the search.

A search keeps the maximum of many noisy measurements, so its best is biased upward (the study this project
started from reported the best of 17 replicates). The top-k distinct configurations are run again `rounds`
times each, interleaved (A B C, B C A, C A B, …) so slow drift hits all of them alike, each run a fresh
process. One score per run (the objective on that run's median) is one independent sample; the leader is
compared with every other finalist (Mann-Whitney U or Welch, Holm-corrected). Finalists that cannot be told
apart from the leader are a tie, and the one using the least memory is recommended; peaks within
`confirm.memory_tolerance` of the smallest are the same memory (a few KiB of RSS is not a saving), and the fastest
of those wins.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoinfer.campaign import store
from autoinfer.campaign.drift import flagged_trials
from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.measure.stats import bootstrap_ci, compare, holm
from autoinfer.paths import results_dir

CONFIRMED_ATTR = "confirmed"


def finalists(study: optuna.Study, weights: dict[str, float], top_k: int) -> list[FrozenTrial]:
    """The best `top_k` feasible successful trials with distinct configurations, drift-flagged ones left out."""
    flagged = flagged_trials(study)
    scored = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number in flagged or not store.is_feasible_ok(t):
            continue
        value = store.score({"tg": store.samples_of(t, "tg"), "pp": store.samples_of(t, "pp")}, weights)
        if value is not None:
            scored.append((value, t))
    scored.sort(key=lambda vt: -vt[0])
    out: list[FrozenTrial] = []
    seen: set[str] = set()
    for _, t in scored:
        key = repr(sorted(t.user_attrs["config"].items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == top_k:
            break
    return out


def _memory(runs: list[dict[str, Any]]) -> tuple[float, str]:
    """The memory a configuration needs: median device peak, or host RSS where no device memory was measured."""
    vram = [r["vram_peak_mib"] for r in runs if r["vram_peak_mib"] is not None]
    if vram:
        return statistics.median(vram), "vram"
    rss = [r["rss_peak_mib"] for r in runs if r["rss_peak_mib"] is not None]
    return (statistics.median(rss), "rss") if rss else (float("inf"), "none")


def decide(scores: dict[int, list[float]], memory: dict[int, float], *, alpha: float, test: str,
           memory_tolerance: float = 0.0) -> dict[str, Any]:
    """Leader, comparisons and recommendation from per-run scores of each finalist (trial number → scores).

    Finalists with fewer than 2 successful runs cannot be judged and are left out.
    """
    judged = {n: s for n, s in scores.items() if len(s) >= 2}
    if not judged:
        return {"leader": None, "recommended": None, "tie": False, "tied_with": [], "comparisons": []}
    leader = max(judged, key=lambda n: statistics.median(judged[n]))
    others = [n for n in judged if n != leader]
    results = [compare(judged[leader], judged[n], alpha=alpha, test=test) for n in others]
    differ = holm([r.p_value for r in results], alpha)
    tied = [n for n, d in zip(others, differ) if not d]
    group = [leader, *tied]
    least = min(memory[n] for n in group)
    lightest = [n for n in group if memory[n] <= least * (1 + memory_tolerance)]
    recommended = max(lightest, key=lambda n: statistics.median(judged[n]))
    return {
        "leader": leader,
        "recommended": recommended,
        "tie": bool(tied),
        "tied_with": tied,
        "comparisons": [{"trial": n, **r.to_dict(), "differ_holm": d} for n, r, d in zip(others, results, differ)],
    }


def confirm(study: optuna.Study, campaign: Campaign, run: Callable[[TrialConfig, Any], Measurement],
            note: Callable[[str], None]) -> dict[str, Any] | None:
    """Re-measure the finalists interleaved, decide, and store the result as the study attribute `confirmed`."""
    spec = campaign.confirm
    weights = campaign.objective_weights()
    chosen = finalists(study, weights, spec.top_k)
    if len(chosen) < 2:
        note(f"confirmation skipped: {len(chosen)} successful configuration(s), at least 2 are needed")
        return None
    note(f"confirming the top {len(chosen)} configurations: {spec.rounds} interleaved rounds in fresh processes")
    folder = results_dir() / study.study_name / "confirm"
    runs: list[dict[str, Any]] = []
    for r in range(spec.rounds):
        order = chosen[r % len(chosen):] + chosen[:r % len(chosen)]
        for t in order:
            m = run(store.config_of(t), folder / f"round{r}-trial{t.number}")
            runs.append({
                "round": r, "trial": t.number, "outcome": m.outcome.value, "reason": m.reason[:500],
                "score": store.score({"tg": list(m.tg_samples), "pp": list(m.pp_samples)}, weights) if m.ok else None,
                "tg_samples": list(m.tg_samples), "pp_samples": list(m.pp_samples),
                "vram_peak_mib": m.vram_peak_mib, "rss_peak_mib": m.rss_peak_mib,
                "idle_busy": bool((m.env.get("idle") or {}).get("busy")),
            })
    per_trial: dict[int, dict[str, Any]] = {}
    for t in chosen:
        mine = [x for x in runs if x["trial"] == t.number]
        scores = [x["score"] for x in mine if x["score"] is not None]
        mem, mem_kind = _memory(mine)
        per_trial[t.number] = {
            "trial": t.number, "params": dict(t.params), "scores": scores,
            "median": statistics.median(scores) if scores else None,
            "ci": list(bootstrap_ci(scores)) if len(scores) >= 2 else None,
            "memory_mib": mem if mem != float("inf") else None, "memory_kind": mem_kind,
            "failed_runs": len(mine) - len(scores),
        }
    verdict = decide({n: p["scores"] for n, p in per_trial.items()},
                     {n: p["memory_mib"] if p["memory_mib"] is not None else float("inf")
                      for n, p in per_trial.items()},
                     alpha=spec.alpha, test=spec.test, memory_tolerance=spec.memory_tolerance)
    record = {
        "time": time.time(), "alpha": spec.alpha, "test": spec.test, "rounds": spec.rounds,
        "memory_tolerance": spec.memory_tolerance,
        "objective": weights, "after_trials": sum(1 for t in study.get_trials(deepcopy=False) if store.is_finished(t)),
        "finalists": [per_trial[t.number] for t in chosen], "runs": runs, **verdict,
    }
    study.set_user_attr(CONFIRMED_ATTR, record)
    note(summary(record))
    return record


def summary(record: dict[str, Any]) -> str:
    """One line: the confirmed winner, or the tie and which configuration is recommended and why."""
    if record.get("recommended") is None:
        return "confirmation: no finalist ran successfully twice; no confirmed winner"
    by_trial = {f["trial"]: f for f in record["finalists"]}
    rec = by_trial[record["recommended"]]
    if record["tie"]:
        group = [record["leader"], *record["tied_with"]]
        within = f" (within {tolerance:.0%})" if (tolerance := record.get("memory_tolerance")) else ""
        return (f"confirmed: tie between trials {', '.join(map(str, group))} (no difference at alpha="
                f"{record['alpha']}); recommended trial {rec['trial']}, the fastest of those using the least "
                f"memory{within} ({rec['memory_kind']} {rec['memory_mib']:.0f} MiB), median {rec['median']:.2f}")
    return (f"confirmed: trial {rec['trial']} is fastest (median {rec['median']:.2f}, 95% CI "
            f"{rec['ci'][0]:.2f}–{rec['ci'][1]:.2f}), different from every other finalist at alpha={record['alpha']}")


def confirmed_best(study: optuna.Study) -> store.Best | None:
    """The recommended configuration of the stored confirmation, as `store.Best` (value = its confirmed median)."""
    record = study.user_attrs.get(CONFIRMED_ATTR)
    if not record or record.get("recommended") is None:
        return None
    t = study.trials[record["recommended"]]
    rec = next(f for f in record["finalists"] if f["trial"] == t.number)
    return store.Best(t, store.config_of(t), rec["median"], confirmation=record)
