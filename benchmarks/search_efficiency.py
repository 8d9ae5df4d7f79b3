"""Random search vs Optuna TPE vs autoinfer's informed search, on replay tables, over many seeds.

For each table and memory budget, every strategy runs the real campaign loop against the replay engine once per
seed; the score is the number of measured trials until the first one within 98% of the table's best feasible row.
Target: the informed search needs at most 1/4 of random search's median trials.

    python benchmarks/search_efficiency.py                       # every table under benchmarks/tables/
    python benchmarks/search_efficiency.py --table benchmarks/tables/h100-35b.csv --budget 8192 --budget 12288

Budgets per table come from --budget (MiB, repeatable) or else the table's .meta.json "budgets_mib"; a table
without either is searched without a memory budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from rich.console import Console

from autoinfer.campaign.replay_cli import STRATEGIES, compare, print_results

TABLES = Path(__file__).resolve().parent / "tables"


def budgets_for(table: Path, given: list[float]) -> list[float | None]:
    if given:
        return list(given)
    meta = table.with_suffix(".meta.json")
    if meta.is_file():
        budgets = json.loads(meta.read_text()).get("budgets_mib")
        if budgets:
            return [float(b) for b in budgets]
    return [None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, action="append", help="replay table(s); default: benchmarks/tables/*.csv")
    ap.add_argument("--budget", type=float, action="append", default=[], help="memory budget in MiB (repeatable)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--objective", default="tg", choices=["tg", "pp", "balanced"])
    ap.add_argument("--out", type=Path, help="also write the results as JSON")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    console = Console()
    summary = []
    for table in args.table or sorted(TABLES.glob("*.csv")):
        for budget in budgets_for(table, args.budget):
            console.print(f"\n[bold]{table.name}[/bold]  budget {budget or 'none'} MiB  "
                          f"{args.seeds} seeds × ≤{args.trials} trials")
            results, best = compare(table, list(STRATEGIES), args.seeds, budget, args.trials, args.objective)
            print_results(console, results, best, args.trials, args.objective)
            by = {r.strategy: r for r in results}
            ratio = by["informed"].median / by["random"].median
            verdict = "meets" if ratio <= 0.25 else "misses"
            console.print(f"informed / random median trials = {by['informed'].median:g} / {by['random'].median:g} "
                          f"= {ratio:.2f} ({verdict} the ≤ 0.25 target)")
            summary.append({"table": table.name, "budget_mib": budget, "best": best, "ratio": ratio,
                            **{r.strategy: {"median": r.median, "trials_needed": list(r.trials_needed),
                                            "predicted_infeasible": list(r.skipped), "wall_s": round(r.wall_s, 1)}
                               for r in results}})
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
