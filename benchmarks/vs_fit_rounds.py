"""Every stored vs-fit run read again by round: benchmarks/vs_fit.py interleaves fit and ours in rounds, one fresh
process each, and a drift that moves both processes of a round (one run's fit rose from 138 to 162 tok/s over five
rounds) widens the ratio of the two sides' medians but cancels in each round's ratio. Prints, per stored run and
budget, vs_fit.py's table row (the two-sample ratio as first printed, and the ratio by round) from the runs the
result file keeps (at a serving context, each peak with the KV cache vs_fit.py counted for it); then the single-GPU
runs pooled per budget and serving context, and over all of them: each run's ratio by round one
observation, their geometric mean with a t interval across runs (hosts and search versions differ between runs, so
this is what a run of the sweep against fit has given, not one configuration's speed); then each run's bandwidth
account as vs_fit.py stored it: the share of its bandwidth ceiling (the tg no placement of its weight bytes could
beat at the host's measured read bandwidth and the GPU's copy bandwidth) each side's median reached. A budget
vs_fit.py stored before its rounds ended (marked `cut`) is named at the end and left out of the tables.

    cd benchmarks && python vs_fit_rounds.py results/vs-fit-*.json > results/vs-fit-by-round.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from vs_fit import account_row, compare_runs, peaks, table_row

from autoinfer.measure.stats import Comparison, compare_paired


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="vs_fit.py result files (.json)")
    args = ap.parse_args(argv)
    print("# vs fit, every stored run read by round\n\nWritten by benchmarks/vs_fit_rounds.py from the interleaved runs "
          "each result file keeps. `tg ours/fit`: the ratio of the two sides' medians with its bootstrap CI and the "
          "Mann-Whitney p, as vs_fit.py first printed it; `by round`: the geometric mean of each round's ours/fit with "
          "its t interval and the paired t-test's p.\n")
    print("| result | budget MiB | fit tg | ours tg | tg ours/fit [95% CI] | tg by round [95% CI] | fit pp512 "
          "| ours pp512 | pp ours/fit [95% CI] | pp by round [95% CI] | fit peak MiB | ours peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_budget: dict[tuple[float, int], list[Comparison]] = defaultdict(list)
    ceilings: list[str] = []
    cut: list[str] = []
    for path in args.results:
        records = json.loads(path.read_text())
        for record in records if isinstance(records, list) else [records]:
            if record.get("cut"):
                cut.append(f"{path.name} at {record['budget_mib']:.0f} MiB ({record['cut']})")
                continue
            runs = record["runs"]
            ratios = compare_runs(runs)
            peak = peaks(runs, record.get("context_mib"))  # at a serving context, with what vs_fit.py counted for it
            print(f"| {path.name} " + table_row(record["budget_mib"], runs, ratios, peak))
            if one_gpu(record):
                by_budget[record["budget_mib"], record.get("serve_context") or 0].append(ratios["tg_by_round"])
            if record.get("bandwidth"):
                ceilings.append(f"| {path.name} " + account_row(record["budget_mib"], record["bandwidth"], runs))
    print("\n## Single-GPU runs pooled\n\nEach run's tg ratio by round is one observation; `pooled`: their geometric "
          "mean with a 95% t interval across runs and the t-test's p against 1; `above` / `below`: runs whose own "
          "interval excludes 1 on that side.\n")
    print("| budget MiB | runs | pooled tg ours/fit [95% CI] | lowest run | highest run | above 1 | below 1 |")
    print("|---|---|---|---|---|---|---|")
    for budget, context in sorted(by_budget):
        label = f"{budget:.0f}" + (f", serving {context} tokens" if context else "")
        print(pooled_row(label, by_budget[budget, context]))
    print(pooled_row("all", [c for cs in by_budget.values() for c in cs]))
    print("\n## Bandwidth ceilings\n\nThe host GB read per generated token by each side's placement, the tg its host "
          "and GPU bytes allow at the measured bandwidths (its ceiling), and the share of it the side's median "
          "reached (runs that stored the account).\n")
    print("| result | budget MiB | fit host GB/token | ours host GB/token | fit tg ceiling (reached) "
          "| ours tg ceiling (reached) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(ceilings))
    if cut:
        print("\nLeft out, cut before their rounds ended: " + "; ".join(cut) + ".")
    return 0


def one_gpu(record: dict) -> bool:
    """Whether a stored run measured one GPU: fit split no tensors, and no run kept a peak per GPU for several (older
    files keep no peaks per GPU)."""
    runs = record["runs"]
    return not record["fit"].get("tensor_split") and all(
        len(p) == 1 for side in ("ours", "fit") for p in runs[side].get("peak_per_gpu", []))


def pooled_row(label: str, runs: list[Comparison]) -> str:
    """One line of the pooled table: the runs' ratios by round as one sample, their geometric mean and interval."""
    ratios = [c.ratio for c in runs]
    pooled = compare_paired(ratios, [1.0] * len(ratios)) if len(ratios) > 1 else None
    cell = "—" if pooled is None else (f"{pooled.ratio:.3f} [{pooled.ratio_ci[0]:.3f}, {pooled.ratio_ci[1]:.3f}] "
                                       f"p={pooled.p_value:.3f}")
    above = sum(c.ratio_ci[0] > 1 for c in runs)
    below = sum(c.ratio_ci[1] < 1 for c in runs)
    return f"| {label} | {len(runs)} | {cell} | {min(ratios):.2f} | {max(ratios):.2f} | {above} | {below} |"


if __name__ == "__main__":
    sys.exit(main())
