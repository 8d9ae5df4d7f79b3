"""The boundary search vs the earlier informed start vs random search, on replay tables, over many seeds.

For each table and memory budget, every strategy runs the real campaign loop against the replay engine once per
seed; the score is the number of measured trials until the first one within 98% of the table's best feasible row.
Targets: the boundary search needs a median of at most 12 trials on every table and budget, and at most 1/4 of
random search's median.

    python benchmarks/search_efficiency.py            # every table under benchmarks/tables/ + 8 synthetic ones
    python benchmarks/search_efficiency.py --table benchmarks/tables/h100-35b.csv --budget 8192 --synthetic 0

Tables: benchmarks/tables/*.csv and synthetic tables with random structure (benchmarks/synthetic_tables.py),
generated into a temporary folder. Budgets per table come from --budget (MiB, repeatable), else the table's
.meta.json "budgets_mib", else those of 8, 12 and 16 GiB that some but not all of its rows fit; a table without a
memory column is searched without a budget. A median counts a seed that never reached the target as trials + 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from rich.console import Console
from rich.table import Table
from synthetic_tables import synthetic_table

from autoinfer.engines.replay import read_table
from autoinfer.sweep.replay_cli import compare, print_results

TABLES = Path(__file__).resolve().parent / "tables"
STRATEGIES = ("boundary", "informed", "random")
GIB = (8192, 12288, 16384)


def budgets_for(table: Path, given: list[float]) -> list[float | None]:
    if given:
        return list(given)
    meta = table.with_suffix(".meta.json")
    if meta.is_file():
        budgets = json.loads(meta.read_text()).get("budgets_mib")
        if budgets:
            return [float(b) for b in budgets]
    df = read_table(table)
    memory = df["vram_mib"] if "vram_mib" in df else None
    if memory is None:
        return [None]
    return [float(b) for b in GIB if memory.min() < b < memory.max()] or [None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, action="append", help="replay table(s); default: benchmarks/tables/*.csv")
    ap.add_argument("--budget", type=float, action="append", default=[], help="memory budget in MiB (repeatable)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--synthetic", type=int, action="append", help="synthetic table seeds (default 0..7)")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--objective", default="tg", choices=["tg", "pp", "balanced"])
    ap.add_argument("--strategy", action="append", choices=STRATEGIES,
                    help="strategies to run (repeatable; default: all, which the ratio to random needs)")
    ap.add_argument("--out", type=Path, help="also write the results as JSON")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    console = Console()
    summary = []
    scratch = tempfile.TemporaryDirectory(prefix="synthetic-tables-")
    tables = list(args.table or sorted(TABLES.glob("*.csv")))
    if not args.no_synthetic:
        tables += [synthetic_table(Path(scratch.name), seed) for seed in (args.synthetic or range(8))]
    for table in tables:
        for budget in budgets_for(table, args.budget):
            console.print(f"\n[bold]{table.name}[/bold]  budget {budget or 'none'} MiB  "
                          f"{args.seeds} seeds × ≤{args.trials} trials")
            strategies = args.strategy or list(STRATEGIES)
            results, best = compare(table, strategies, args.seeds, budget, args.trials, args.objective)
            print_results(console, results, best, args.trials, args.objective)
            by = {r.strategy: r for r in results}
            ratio = by["boundary"].median / by["random"].median if {"boundary", "random"} <= set(by) else None
            if ratio is not None:
                console.print(f"boundary / random median trials = {by['boundary'].median:g} / "
                              f"{by['random'].median:g} = {ratio:.2f}")
            summary.append({"table": table.name, "budget_mib": budget, "best": best, "ratio": ratio,
                            **{r.strategy: {"median": r.median, "trials_needed": list(r.trials_needed),
                                            "predicted_infeasible": list(r.skipped), "wall_s": round(r.wall_s, 1)}
                               for r in results}})
    print_summary(console, summary, args.trials)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def print_summary(console: Console, summary: list[dict], trials: int) -> None:
    """One line per table and budget, then the worst table against the targets."""
    out = Table(title=f"median measured trials to 98% of the best feasible row (>{trials}: not reached by half)")
    ran = [s for s in STRATEGIES if s in summary[0]]
    for col in ("table", "budget MiB", *ran, "boundary/random"):
        out.add_column(col)

    def shown(entry: dict) -> str:
        return f"{entry['median']:g}" if entry["median"] <= trials else f">{trials}"

    for row in summary:
        out.add_row(row["table"], f"{row['budget_mib']:.0f}" if row["budget_mib"] else "none",
                    *(shown(row[s]) for s in ran), f"{row['ratio']:.2f}" if row["ratio"] is not None else "—")
    console.print(out)
    if "boundary" not in ran:
        return
    worst = max(summary, key=lambda r: r["boundary"]["median"])
    medians = [r["boundary"]["median"] for r in summary]
    console.print(f"boundary: worst table {worst['table']} at {worst['budget_mib'] or 'no'} MiB budget, median "
                  f"{shown(worst['boundary'])} trials (target ≤ 12: "
                  f"{'met' if worst['boundary']['median'] <= 12 else 'missed'}); median over tables "
                  f"{statistics.median(medians):g}")
    if "random" not in ran:
        return
    worst_ratio = max(summary, key=lambda r: r["ratio"])
    console.print(f"boundary/random: worst {worst_ratio['ratio']:.2f} on {worst_ratio['table']} at "
                  f"{worst_ratio['budget_mib'] or 'no'} MiB (target ≤ 0.25: "
                  f"{'met' if worst_ratio['ratio'] <= 0.25 else 'missed'}; random's median is censored at "
                  f"{trials + 1} where it never got there)")


if __name__ == "__main__":
    sys.exit(main())
