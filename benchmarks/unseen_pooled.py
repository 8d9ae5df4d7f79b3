"""The unseen synthetic sets judged with one search, pooled: one set of 24 seeds says little about how often the search
misses its target (0 to 8 table-budgets of about 62 noise-free, set to set, with the search unchanged), so the
misses are counted over every set, with a Clopper-Pearson interval (scipy's binomtest), beside each set's counts.

Reads pairs of search_efficiency.py result files by their set: `search-efficiency-<seeds>-fresh-noise.json` (the
boundary search, --fresh-noise) and `search-efficiency-<seeds>-random100.json` (random search's 100 trials) beside
it. Prints per set and pooled: table-budgets, medians above 12 trials noise-free and by rows, at most 1/4 of random
search's median (by rows, noise-free), and the answer after 12 trials (median over table-budgets; below 95%, 90%).

    cd benchmarks && python unseen_pooled.py results/search-efficiency-{1776-1799,1800-1823}-fresh-noise.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from scipy.stats import binomtest
from search_efficiency import TARGET_RATIO, TARGET_TRIALS

FRESH = "-fresh-noise.json"  # the boundary search's result file
RANDOM = "-random100.json"  # random search's, beside it
RUNS = {FRESH: "--strategy boundary --seeds 5 --fresh-noise",
        RANDOM: "--strategy random --random-trials 100 --trials 100 --seeds 5 --fresh-noise"}  # how each is written


def read(path: Path, kind: str) -> list[dict]:
    """A result file's rows, or a ValueError that says how to write it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path} ({e.__class__.__name__}): run search_efficiency.py {RUNS[kind]} on "
                         f"its seeds with --out {path}") from None


def set_counts(ours: list[dict], random: list[dict]) -> dict:
    """One set's counts from its boundary and random result rows (matched by table and budget)."""
    if not ours:
        raise ValueError("no table-budget in it: search_efficiency.py judged no table")
    by_case = {(r["table"], r["budget_mib"]): r["random"] for r in random}
    missing = [(o["table"], o["budget_mib"]) for o in ours if (o["table"], o["budget_mib"]) not in by_case]
    if missing:
        raise ValueError(f"random search has no run for {missing[0][0]} at {missing[0][1]:.0f} MiB: run "
                         f"search_efficiency.py {RUNS[RANDOM]} on the same seeds")
    runs = [(o["boundary"], by_case[(o["table"], o["budget_mib"])]) for o in ours]
    return {
        "cases": len(runs),
        "above_noise_free": sum(b["median_noise_free"] > TARGET_TRIALS for b, _ in runs),
        "above_rows": sum(b["median"] > TARGET_TRIALS for b, _ in runs),
        "quarter_rows": sum(b["median"] / r["median"] <= TARGET_RATIO for b, r in runs),
        "quarter_noise_free": sum(b["median_noise_free"] / r["median_noise_free"] <= TARGET_RATIO
                                  for b, r in runs),
        "answers": [b["answer_median"] for b, _ in runs],
    }


def share(k: int, n: int) -> str:
    """k of n with its proportion and 95% Clopper-Pearson interval."""
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return f"{k} ({k / n:.1%} [{ci.low:.1%}, {ci.high:.1%}])"


def row(name: str, c: dict) -> str:
    answers = c["answers"]
    return (f"| {name} | {c['cases']} | {share(c['above_noise_free'], c['cases'])} | "
            f"{share(c['above_rows'], c['cases'])} | {c['quarter_rows']}, {c['quarter_noise_free']} | "
            f"{statistics.median(answers):.1%}, {sum(a < 0.95 for a in answers)}, {sum(a < 0.90 for a in answers)}, "
            f"{min(answers):.1%} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="search-efficiency-<seeds>-fresh-noise.json files")
    args = ap.parse_args(argv)
    pooled: dict = {}
    lines = []
    for path in args.results:
        if not path.name.endswith(FRESH):
            print(f"error: {path} is not a search-efficiency-<seeds>{FRESH} file", file=sys.stderr)
            return 2
        random = path.with_name(path.name[: -len(FRESH)] + RANDOM)
        try:
            counts = set_counts(read(path, FRESH), read(random, RANDOM))
        except ValueError as e:
            print(f"error: {path.name}: {e}", file=sys.stderr)
            return 2
        except KeyError as e:
            print(f"error: {path.name}: a result row lacks {e}; it is not search_efficiency.py's output",
                  file=sys.stderr)
            return 2
        name = path.name[len("search-efficiency-"): -len(FRESH)]
        lines.append(row(name, counts))
        for key, value in counts.items():
            pooled[key] = pooled.get(key, 0 if key != "answers" else []) + value
    print("| set | table-budgets | noise-free median above 12 [95% CI] | by rows above 12 [95% CI] | at most 1/4 of "
          "random's: by rows, noise-free | answer after 12: median, below 95%, below 90%, worst |")
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))
    print(row(f"pooled ({len(lines)} set{'s' if len(lines) > 1 else ''})", pooled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
