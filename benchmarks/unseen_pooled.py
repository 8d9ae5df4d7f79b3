"""The unseen synthetic sets judged with one search, pooled: one set of 24 seeds says little about how often the search
misses its target (0 to 8 table-budgets of about 62 noise-free, set to set, with the search unchanged), so the
misses are counted over every set, with a Clopper-Pearson interval (scipy's binomtest), beside each set's counts.

Reads pairs of search_efficiency.py result files by their set: `search-efficiency-<seeds>-fresh-noise.json` (the
boundary search, --fresh-noise) and `search-efficiency-<seeds>-random100.json` (random search's 100 trials) beside
it. Prints per set and pooled: table-budgets, medians above 12 trials noise-free and by rows, at most 1/4 of random
search's median (by rows, noise-free), and the answer after 12 trials (median over table-budgets; below 95%, 90%).
With --misses, each set's account as search-efficiency.md writes it follows the table: medians per budget, every
table-budget above 12 (its traps and rows at the target), those with a trap, the worst answers, the ratios to random
search and the ones above a quarter, and the trials over the budget among the first 12.

    cd benchmarks && python unseen_pooled.py results/search-efficiency-{1776-1799,1800-1823}-fresh-noise.json
    python unseen_pooled.py --misses results/search-efficiency-2712-2735-fresh-noise.json
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


def _gib(budget_mib: float | None) -> str:
    return "no budget" if budget_mib is None else f"{budget_mib / 1024:g} GiB"


def _case(o: dict) -> str:
    return f"{Path(o['table']).stem} at {_gib(o['budget_mib'])}"


def misses(ours: list[dict], random: list[dict]) -> list[str]:
    """One set's account: what search-efficiency.md's bullets for a set say, from its two result files."""
    by_case = {(r["table"], r["budget_mib"]): r["random"] for r in random}
    budgets = sorted({o["budget_mib"] for o in ours}, key=lambda b: (b is None, b or 0))
    per = {b: [o for o in ours if o["budget_mib"] == b] for b in budgets}

    def medians(key: str) -> str:
        return " / ".join(f"{statistics.median(o['boundary'][key] for o in per[b]):g}" for b in budgets)

    lines = [f"medians at {' / '.join(_gib(b) for b in budgets)}: by rows {medians('median')}, noise-free "
             f"{medians('median_noise_free')}"]
    for key, name in (("median_noise_free", "noise-free"), ("median", "by rows")):
        above = [o for o in ours if o["boundary"][key] > TARGET_TRIALS]
        lines.append(f"{name} above {TARGET_TRIALS} on {len(above)}:")
        lines += [f"  {_case(o)}: noise-free {o['boundary']['median_noise_free']}, by rows {o['boundary']['median']}; "
                  f"traps {o['traps']}; rows at the target {o['rows_at_target']} of {o['feasible_rows']}"
                  for o in above]
    trapped = [o["boundary"]["median_noise_free"] for o in ours if o["traps"] > 0]
    if trapped:
        lines.append(f"with a trap: {len(trapped)}, noise-free median {statistics.median(trapped):g}, above "
                     f"{TARGET_TRIALS} on {sum(m > TARGET_TRIALS for m in trapped)}")
    worst = sorted(ours, key=lambda o: o["boundary"]["answer_median"])[:3]
    lines.append("worst answers after 12: " + ", ".join(f"{_case(o)} {o['boundary']['answer_median']:.1%}"
                                                        for o in worst))
    for key, name in (("median", "by rows"), ("median_noise_free", "noise-free")):
        pairs = [(o, by_case[(o["table"], o["budget_mib"])][key]) for o in ours]
        ratios = [o["boundary"][key] / r for o, r in pairs]
        within = sum(r <= 100 for _, r in pairs)
        over = [f"{_case(o)} ({o['boundary'][key]} against {r})" for o, r in pairs
                if o["boundary"][key] / r > TARGET_RATIO]
        lines.append(f"against random search {name}: within 100 on {within}, median ratio "
                     f"{statistics.median(ratios):.3f}, above a quarter on {len(over)}" + (f": {', '.join(over)}"
                                                                                          if over else ""))
    lines.append("over the budget among the first 12, per run: " + " / ".join(
        f"{statistics.mean(statistics.mean(o['boundary']['over']) for o in per[b]):.2f}" for b in budgets)
        + f" (at most {max(max(o['boundary']['over']) for o in ours)} in one run)")
    return lines


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
    ap.add_argument("--misses", action="store_true", help="each set's misses after the table")
    args = ap.parse_args(argv)
    pooled: dict = {}
    lines, accounts = [], []
    for path in args.results:
        if not path.name.endswith(FRESH):
            print(f"error: {path} is not a search-efficiency-<seeds>{FRESH} file", file=sys.stderr)
            return 2
        random = path.with_name(path.name[: -len(FRESH)] + RANDOM)
        try:
            ours, theirs = read(path, FRESH), read(random, RANDOM)
            counts = set_counts(ours, theirs)
            name = path.name[len("search-efficiency-"): -len(FRESH)]
            if args.misses:
                accounts += ["", f"{name}:", *misses(ours, theirs)]
        except ValueError as e:
            print(f"error: {path.name}: {e}", file=sys.stderr)
            return 2
        except KeyError as e:
            print(f"error: {path.name}: a result row lacks {e}; it is not search_efficiency.py's output",
                  file=sys.stderr)
            return 2
        lines.append(row(name, counts))
        for key, value in counts.items():
            pooled[key] = pooled.get(key, 0 if key != "answers" else []) + value
    print("| set | table-budgets | noise-free median above 12 [95% CI] | by rows above 12 [95% CI] | at most 1/4 of "
          "random's: by rows, noise-free | answer after 12: median, below 95%, below 90%, worst |")
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))
    print(row(f"pooled ({len(lines)} set{'s' if len(lines) > 1 else ''})", pooled))
    if accounts:
        print("\n".join(accounts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
