"""Every stored vs-fit run read again by round: benchmarks/vs_fit.py interleaves fit and ours in rounds, one fresh
process each, and a drift that moves both processes of a round (one run's fit rose from 138 to 162 tok/s over five
rounds) widens the ratio of the two sides' medians but cancels in each round's ratio. Prints, per stored run and
budget, vs_fit.py's table row (the two-sample ratio as first printed, and the ratio by round) from the runs the
result file keeps.

    cd benchmarks && python vs_fit_rounds.py results/vs-fit-*.json > results/vs-fit-by-round.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vs_fit import compare_runs, peaks, table_row


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
    for path in args.results:
        records = json.loads(path.read_text())
        for record in records if isinstance(records, list) else [records]:
            runs = record["runs"]
            print(f"| {path.name} " + table_row(record["budget_mib"], runs, compare_runs(runs), peaks(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
