"""Final re-measurement: the winner is chosen on fresh, interleaved runs of the top configurations, not on the
luckiest trial of the search.

A search keeps the maximum of many noisy measurements, so its best is biased upward (the study this project
started from reported the best of 17 replicates). The top-k distinct configurations are run again, interleaved
(A B C, B C A, C A B, …) so slow drift hits all of them alike, each run a fresh process: `rounds` rounds, then more
while the leader/runner-up ratio's 95% CI is wider than ±`precision`, up to `max_rounds`. One score per run (the
objective on that run's median); the leader is compared with every other finalist, Holm-corrected, and the ratio
printed as hyperfine does. By default round by round (`paired`: the geometric mean of the rounds' ratios, a paired
t-test on their logs), since a drift that moves every process of a round cancels in that round's ratio: over the
31 interleaved vs-fit runs on H100/H200 hosts the paired interval was narrower than the two-sample one in 20, by
0.85x at the median (benchmarks/vs_fit_rounds.py); or as two samples (Mann-Whitney U or Welch). The objective
decides: memory breaks a tie only between finalists the test cannot tell apart whose speed is within
`speed_tolerance` of the leader's (peaks within `memory_tolerance` count as the same memory). A finalist that needs
clearly less memory is offered on its own line, never silently put in the faster one's place. Memory is what the
budget counts: the peak on its side, with the serving context's share where llama-bench did not create that context
(q8_0 K and V caches grow 308 MiB less than f16 ones to 32768 tokens on the 35B-A3B stand-in).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Mapping

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import Campaign
from autoinfer.campaign.spec import Confirm as ConfirmSpec
from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.measure.stats import Comparison, bootstrap_ci, compare, compare_paired, holm, smallest_p
from autoinfer.paths import results_dir
from autoinfer.search.fit_baseline import is_fit_trial
from autoinfer.store import trials as store
from autoinfer.store.records import (
    FIT_ANSWER,
    Alternative,
    Confirmation,
    ConfirmRun,
    Finalist,
    FinalistComparison,
    TrialRecord,
    Verdict,
)
from autoinfer.store.trials import Store, flagged_trials

#: How the weights kept in RAM are held: mmap, pinned buffers, or malloc's memory on huge pages. What they do to
#: generation depends on the host (huge pages against mmap at one placement, by round: 1.05 [1.02, 1.09] on an H100
#: host, 1.20 [1.11, 1.30] on an H200 host, 1.21 [0.86, 1.71] in 3 rounds on another H100 host;
#: benchmarks/results/huge-pages.md) and is about one process's scatter, so a search that measures each
#: configuration once ranks them by luck: on that last host two sweeps measured 8 huge-page trials, 5 below their
#: mmap twins, and confirmed none (benchmarks/results/vs-fit-h100.md, f0898b6). The confirmation measures the
#: leader's twins in them beside it, in the same interleaved rounds.
HOST_BUFFER_KNOBS = ("load_mode", "huge_pages")


def config_key(config: Mapping[str, Any]) -> str:
    """Equal for trials that ran the same configuration."""
    return repr(sorted(config.items()))


def _other_knobs(config: Mapping[str, Any]) -> str:
    return config_key({k: v for k, v in config.items() if k not in HOST_BUFFER_KNOBS})


def _host_buffer(config: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(config.get(k) for k in HOST_BUFFER_KNOBS)


def host_buffer_twins(leader: TrialRecord, ranked: list[TrialRecord]) -> list[TrialRecord]:
    """For each other way of holding the weights in RAM that was measured with every other knob as the leader's, the
    best-ranked trial that measured it (`ranked`: best first)."""
    twins: dict[tuple[Any, ...], TrialRecord] = {}
    own, others = _host_buffer(leader.config), _other_knobs(leader.config)
    for t in ranked:
        held = _host_buffer(t.config)
        if held != own and held not in twins and _other_knobs(t.config) == others:
            twins[held] = t
    return list(twins.values())


def leader_twins(chosen: dict[int, TrialRecord]) -> list[TrialRecord]:
    """The host-buffer twins among finalists (`chosen` in the order finalists() gives, the leader first)."""
    ordered = list(chosen.values())
    return host_buffer_twins(ordered[0], ordered) if ordered else []


def finalists(study: optuna.Study, weights: dict[str, float], top_k: int) -> list[TrialRecord]:
    """The best `top_k` feasible successful trials with distinct configurations, drift-flagged ones left out; the
    best llama-fit-params baseline among them or beside them: what the answer has to beat is measured with it; and
    the leader's host-buffer twins (HOST_BUFFER_KNOBS) among them or beside them."""
    flagged = flagged_trials(study)
    scored = []
    for t in Store(study).records(states=(TrialState.COMPLETE,)):
        if t.number in flagged or not t.is_feasible_ok:
            continue
        value = store.score({"tg": t.samples("tg"), "pp": t.samples("pp")}, weights)
        if value is not None:
            scored.append((value, t))
    scored.sort(key=lambda vt: -vt[0])
    ranked = [t for _, t in scored]
    out: dict[str, TrialRecord] = {}  # by configuration: the first, best-ranked trial of each
    for t in ranked:
        out.setdefault(config_key(t.config), t)
        if len(out) == top_k:
            break
    baseline = [t for t in ranked if is_fit_trial(t)][:1]
    twins = host_buffer_twins(next(iter(out.values())), ranked) if out else []
    for t in baseline + twins:
        out.setdefault(config_key(t.config), t)
    return list(out.values())


def finalist_label(chosen: dict[int, TrialRecord]) -> Callable[[int], str]:
    """Names a finalist, the llama-fit-params baseline and the leader's host-buffer twins as such (`chosen` in the
    order finalists() gives, the leader first)."""
    notes = {n: f" ({FIT_ANSWER})" for n, t in chosen.items() if is_fit_trial(t)}
    for t in leader_twins(chosen):
        held = ", ".join(f"{k} {v}" for k, v in zip(HOST_BUFFER_KNOBS, _host_buffer(t.config)) if v is not None)
        notes[t.number] = notes.get(t.number, "") + f" (trial {next(iter(chosen))} with {held})"
    return lambda n: f"trial {n}" + notes.get(n, "")


def stored_summary(study: optuna.Study, record: Confirmation) -> str:
    """summary() of a study's stored confirmation, its finalists named as the sweep named them."""
    study_store = Store(study)
    return summary(record, finalist_label({f.trial: study_store.record(f.trial) for f in record.finalists}))


def memory_of(vram: list[float], rss: list[float], side: str | None) -> tuple[float | None, str]:
    """The memory a configuration needs, the median of its measured peaks: on the budget's side ("device": the
    largest GPU's, "host": RSS), since that is the memory the user counts; without a budget (None) the device
    peak, or host RSS where no device memory was measured."""
    if side == "host" or (side is None and not vram):
        return (statistics.median(rss), "rss") if rss else (None, "none")
    return (statistics.median(vram), "vram") if vram else (None, "none")


def counted_memory(memory_mib: float | None, context_mib: float | None) -> float:
    """The memory as the budget counts it: the measured peak (memory_of) and the serving context's share on top
    (inf where nothing was measured, so it never wins on memory)."""
    return math.inf if memory_mib is None else memory_mib + (context_mib or 0.0)


def lighter_alternative(medians: dict[int, float], memory: dict[int, float], chosen: int,
                       memory_tolerance: float, context: Mapping[int, float] | None = None) -> Alternative | None:
    """The fastest finalist that needs less memory than `chosen` beyond the tolerance and saves a larger fraction of
    memory than it loses of speed (None when there is none); `memory` as the budget counts it, with the serving
    context's share (`context`, to say how much of it that is)."""
    limit = memory[chosen] * (1 - memory_tolerance)
    lighter = [n for n in medians if n != chosen and memory[n] < limit
               and 1 - memory[n] / memory[chosen] > 1 - medians[n] / medians[chosen]]
    if not lighter or not math.isfinite(memory[chosen]):
        return None
    n = max(lighter, key=lambda k: medians[k])
    return Alternative(n, medians[n], memory[n], 1 - medians[n] / medians[chosen], memory[chosen] - memory[n],
                       (context or {}).get(n) or 0.0)


def trial_label(n: int) -> str:
    return f"trial {n}"


def compare_finalists(scores: dict[int, list[float]], score_rounds: dict[int, list[int]] | None, a: int, b: int, *,
                      alpha: float, test: str) -> Comparison:
    """Finalist a against b (trial numbers in `scores`): round by round for `paired` (`score_rounds`: each score's
    round), else as two samples. A pair with fewer than 2 rounds where both ran is compared as two samples by
    Mann-Whitney U, which the comparison's test names."""
    if test != "paired":
        return compare(scores[a], scores[b], alpha=alpha, test=test)
    if score_rounds is None or a not in score_rounds or b not in score_rounds:
        raise ValueError("the paired test needs the round of every score")
    by_a, by_b = dict(zip(score_rounds[a], scores[a])), dict(zip(score_rounds[b], scores[b]))
    common = sorted(by_a.keys() & by_b.keys())
    if len(common) < 2:
        return compare(scores[a], scores[b], alpha=alpha, test="mannwhitney")
    return compare_paired([by_a[r] for r in common], [by_b[r] for r in common], alpha=alpha)


def decide(scores: dict[int, list[float]], memory: dict[int, float], *, alpha: float, test: str,
           memory_tolerance: float = 0.0, speed_tolerance: float = 0.0,
           label: Callable[[int], str] = trial_label, score_rounds: dict[int, list[int]] | None = None,
           context: Mapping[int, float] | None = None) -> Verdict:
    """Leader, comparisons and recommendation from per-run scores of each finalist (trial number → scores, and for
    the paired test `score_rounds`: trial number → each score's round); `memory` as the budget counts it, with the
    serving context's share (`context`, named in the lighter alternative); `label` names a finalist in the verdict's
    reason.

    Finalists with fewer than 2 successful runs cannot be judged and are left out. The leader is the fastest median,
    or for the paired test the finalist fastest against it in the rounds both ran: where a finalist failed in some
    rounds the medians compare different rounds, which a drift makes unlike. The recommendation is the leader,
    unless a finalist tied with it (not different after Holm) and within `speed_tolerance` of its speed needs less
    memory (beyond `memory_tolerance`).
    """
    judged = {n: s for n, s in scores.items() if len(s) >= 2}
    if not judged:
        return Verdict()
    medians = {n: statistics.median(s) for n, s in judged.items()}

    def against(a: int, b: int) -> Comparison:
        return compare_finalists(judged, score_rounds, a, b, alpha=alpha, test=test)

    leader = max(judged, key=lambda n: medians[n])
    if test == "paired":
        ahead = {n: against(n, leader).ratio for n in judged if n != leader}
        leader = max([leader, *ahead], key=lambda n: ahead.get(n, 1.0))
    others = [n for n in judged if n != leader]
    results = [against(leader, n) for n in others]
    speed = {leader: 1.0, **{n: 1 / r.ratio for n, r in zip(others, results)}}  # against the leader's
    differ = holm([r.p_value for r in results], alpha)
    tied = [n for n, d in zip(others, differ) if not d]
    close = [leader, *(n for n in tied if speed[n] >= 1 - speed_tolerance)]
    least = min(memory[n] for n in close)
    lightest = [n for n in close if memory[n] <= least * (1 + memory_tolerance)]
    recommended = max(lightest, key=lambda n: speed[n])
    fastest = "fastest of the finalists round by round" if test == "paired" else "fastest median of the finalists"
    if recommended != leader:
        why = (f"tied with the leader ({label(leader)}) within {speed_tolerance:.0%} of its speed, and uses less "
               "memory: memory breaks the tie")
    elif tied:
        why = (f"{fastest}; {', '.join(map(label, tied))} cannot be told apart from it "
               f"at alpha={alpha}, but none is within {speed_tolerance:.0%} and lighter, so the objective decides")
    else:
        why = f"{fastest}, different from every other at alpha={alpha}"
    judged_memory = {n: memory[n] for n in judged}
    return Verdict(leader, recommended, bool(tied), tuple(tied),
                   tuple(FinalistComparison(n, r.p_value, r.differ, r.test, r.ratio, tuple(r.ratio_ci), d)
                         for n, r, d in zip(others, results, differ)),
                   lighter_alternative(medians, judged_memory, recommended, memory_tolerance, context),
                   "confirmed: " + why)


def ratio_line(a: int, b: int, ratio: float, ci: tuple[float, float] | list[float],
               label: Callable[[int], str] = trial_label) -> str:
    """hyperfine's way of saying how much faster: "trial 3 ran 1.16 ± 0.04 times faster than trial 0" (± is the
    half-width of the ratio's 95% CI: the rounds' t interval for the paired test, a bootstrap one for two samples)."""
    return f"{label(a)} ran {ratio:.2f} ± {(ci[1] - ci[0]) / 2:.2f} times faster than {label(b)}"


def precise_enough(scores: dict[int, list[float]], precision: float, test: str,
                   score_rounds: dict[int, list[int]] | None = None) -> bool:
    """Whether the leader/runner-up ratio's CI is within ±precision (relative to the ratio); `score_rounds` as
    decide() takes them."""
    judged = {n: s for n, s in scores.items() if len(s) >= 2}
    if len(judged) < 2:
        return True
    ranked = sorted(judged, key=lambda n: -statistics.median(judged[n]))
    c = compare_finalists(judged, score_rounds, ranked[0], ranked[1], alpha=0.05, test=test)
    return (c.ratio_ci[1] - c.ratio_ci[0]) / 2 <= precision * c.ratio


def interleave(keys: list[int], run: Callable[[int, int], Measurement], spec: ConfirmSpec,
               weights: dict[str, float], note: Callable[[str], None]) -> tuple[list[ConfirmRun], int]:
    """Fresh runs of the finalists `keys` (run(key, round) measures one), interleaved round by round, `spec.rounds`
    rounds and then more while the leaders' ratio is wider than ±precision, up to max_rounds. Returns the runs and
    the number of rounds."""
    runs: list[ConfirmRun] = []
    r = 0
    while r < spec.max_rounds:
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            m = run(key, r)
            runs.append(ConfirmRun(
                r, key, m.outcome.value, m.reason[:500],
                store.score({"tg": list(m.tg_samples), "pp": list(m.pp_samples)}, weights) if m.ok else None,
                m.tg_samples, m.pp_samples, m.vram_peak_mib, m.rss_peak_mib,
                bool((m.env.get("idle") or {}).get("busy"))))
        r += 1
        if r >= spec.rounds:
            scores, score_rounds = _scored(keys, runs)
            if precise_enough(scores, spec.precision, spec.test, score_rounds):
                break
            if r < spec.max_rounds:
                note(f"confirmation: the leaders' ratio is not yet within ±{spec.precision:.0%} after {r} rounds; "
                     "one more round")
    return runs, r


def _scored(keys: list[int], runs: list[ConfirmRun]) -> tuple[dict[int, list[float]], dict[int, list[int]]]:
    """Each finalist's scores of its successful runs, and each score's round (for the paired test)."""
    ok = [x for x in runs if x.score is not None]
    scores = {k: [x.score for x in ok if x.trial == k] for k in keys}
    return scores, {k: [x.round for x in ok if x.trial == k] for k in keys}


def judge(params: dict[int, Mapping[str, Any]], runs: list[ConfirmRun], rounds: int, spec: ConfirmSpec,
          weights: dict[str, float], after_trials: int | None,
          label: Callable[[int], str] = trial_label, *, side: str | None = None,
          context: Mapping[int, float | None] | None = None) -> Confirmation:
    """The confirmation record of interleaved `runs` of the finalists (key → their parameters): each finalist's
    scores and memory on the budget's `side` (memory_of), and the verdict. `context`: what the serving context adds
    to a finalist's measured peak there (its trial's TrialRecord.context_mib), counted where memory breaks a tie."""
    per_key: dict[int, Finalist] = {}
    all_scores, score_rounds = _scored(list(params), runs)
    for key, values in params.items():
        mine = [x for x in runs if x.trial == key]
        scores = all_scores[key]
        mem, mem_kind = memory_of([r.vram_peak_mib for r in mine if r.vram_peak_mib is not None],
                                  [r.rss_peak_mib for r in mine if r.rss_peak_mib is not None], side)
        per_key[key] = Finalist(
            key, dict(values), tuple(scores), statistics.median(scores) if scores else None,
            bootstrap_ci(scores) if len(scores) >= 2 else None, mem, mem_kind, len(mine) - len(scores),
            (context or {}).get(key) if mem is not None else None)
    verdict = decide(all_scores, {n: counted_memory(p.memory_mib, p.context_mib) for n, p in per_key.items()},
                     alpha=spec.alpha, test=spec.test, memory_tolerance=spec.memory_tolerance,
                     speed_tolerance=spec.speed_tolerance, label=label, score_rounds=score_rounds,
                     context={n: p.context_mib for n, p in per_key.items() if p.context_mib})
    return Confirmation(
        time.time(), spec.alpha, spec.test, rounds, spec.memory_tolerance, spec.speed_tolerance, spec.precision,
        weights, after_trials, tuple(per_key.values()), tuple(runs), verdict)


def confirm(study: optuna.Study, campaign: Campaign, run: Callable[[TrialConfig, Any], Measurement],
            note: Callable[[str], None]) -> Confirmation | None:
    """Re-measure the finalists interleaved, decide, and store the result on the study (StudyRecord.confirmed)."""
    spec = campaign.confirm
    weights = campaign.objective_weights()
    chosen = {t.number: t for t in finalists(study, weights, spec.top_k)}
    if len(chosen) < 2:
        note(f"confirmation skipped: {len(chosen)} successful configuration(s), at least 2 are needed")
        return None
    label = finalist_label(chosen)
    fit = [n for n, t in chosen.items() if is_fit_trial(t)]
    twins = [t.number for t in leader_twins(chosen)]
    beside = (f" (trial {fit[0]}, llama-fit-params' answer, is the baseline)" if fit else "") + (
        f" (trial {', '.join(map(str, twins))}: trial {next(iter(chosen))} with its weights in RAM held another way, "
        "a difference one process per configuration cannot tell)" if twins else "")
    note(f"confirming the top {len(chosen)} configurations{beside}: {spec.rounds} interleaved rounds in fresh "
         f"processes (up to {spec.max_rounds} while the leaders' ratio is wider than ±{spec.precision:.0%})")
    folder = results_dir() / study.study_name / "confirm"
    runs, rounds = interleave(list(chosen), lambda n, r: run(chosen[n].trial_config, folder / f"round{r}-trial{n}"),
                              spec, weights, note)
    study_store = Store(study)
    record = judge({n: t.params for n, t in chosen.items()}, runs, rounds, spec, weights,
                   sum(1 for t in study_store.records() if t.is_finished), label, side=campaign.constraints.side,
                   context={n: t.context_mib for n, t in chosen.items()})
    study_store.write_study(confirmed=record)
    note(summary(record, label))
    return record


def summary(record: Confirmation, label: Callable[[int], str] = trial_label) -> str:
    """The confirmed winner, and the leader against each other finalist as hyperfine says it (the verdict's `why`
    says why the winner was chosen)."""
    verdict = record.verdict
    if verdict.recommended is None:
        return "confirmation: no finalist ran successfully twice; no confirmed winner"
    rec = record.finalist(verdict.recommended)
    ci = f", 95% CI {rec.ci[0]:.2f}–{rec.ci[1]:.2f}" if rec.ci else ""
    lines = [f"confirmed over {record.rounds} interleaved rounds: {label(rec.trial)}, median {rec.median:.2f}{ci}"]
    for c in verdict.comparisons:
        n, m = len(record.finalist(verdict.leader).scores), len(record.finalist(c.trial).scores)
        if c.differ_holm:
            tail = ""
        elif smallest_p(n, m, c.test) >= record.alpha:  # a narrow ratio CI must not read as a measured tie
            tail = f" (too few runs to tell apart: {n} against {m} cannot differ at alpha={record.alpha})"
        else:
            tail = f" (not different at alpha={record.alpha})"
        lines.append("  " + ratio_line(verdict.leader, c.trial, c.ratio, c.ratio_ci, label) + tail)
        if (prompt := prompt_line(record, verdict.leader, c.trial)) is not None:
            lines.append("    " + prompt)
    return "\n".join(lines)


def prompt_line(record: Confirmation, a: int, b: int) -> str | None:
    """Prompt speed beside a decode objective, which left it out: the two finalists' medians over their runs (an
    answer may trade the prompt for decode: 0.59-0.66x llama-fit-params' pp512 on an H100 at a 32768-token context)."""
    if "pp" in record.objective:
        return None
    pa, pb = record.run_medians([a], "pp"), record.run_medians([b], "pp")
    if not pa or not pb:
        return None
    ma, mb = statistics.median(pa), statistics.median(pb)
    return f"prompt processing (not in the objective): {ma:.0f} against {mb:.0f} tok/s, {ma / mb:.2f}x"
