"""The boundary search vs random search (and the earlier informed start), on replay tables, over many seeds.

For each table and memory budget, every strategy runs the real campaign loop against the replay engine once per
seed; the score is the number of measured trials until the first one within 98% of the table's best feasible row.
Synthetic tables are also scored against 98% of the best feasible noise-free value (their generator knows it; a
row lifted by its noise cannot set that target). Targets: the boundary search needs a median of at most 12 trials
on every table and budget, and at most 1/4 of random search's median. Each run is also scored by what its answer
after 12 trials is worth (autoinfer/sweep/replay_cli.py, SeedRun.answer): what stopping there costs.
A table row is one process's measurement: replayed again (the search's `again`), it repeats its luck. With
--fresh-noise a synthetic table's every run is a new process's draw around the row's noise-free speed, with the
generator's noise, as a real campaign measures; the row-based target stays the table's rows.

    python benchmarks/search_efficiency.py     # every table under benchmarks/tables/ + the unseen synthetic seeds
    python benchmarks/search_efficiency.py --table benchmarks/tables/h100-35b.csv --budget 8192 --no-synthetic
    python benchmarks/search_efficiency.py --no-measured --synthetic 0 --synthetic 1 --strategy boundary
    python benchmarks/search_efficiency.py --random-trials 100 --jobs 16    # all of it, on a 16-core machine

Tables: benchmarks/tables/*.csv and synthetic tables with random structure (benchmarks/synthetic_tables.py),
generated into a temporary folder. The default synthetic seeds (REPORT_SEEDS) have not been looked at. Seeds 0-19 were
looked at while the search was developed; 100-123, whose worst tables were traced for the peaks carried over between
knob values; 124-147, of which 124, 126, 128 and 138 were traced for the knob effects' residual; 148-183 judged
later changes and were traced where worst; 184-207 judged the search once, were then traced where worst and
judged two changes that were not kept; 208-231 judged the search once more, as it stands; then 227 was traced,
184-231 judged a third change and 184-207 a fourth, neither kept; then 185, 193, 199, 200, 206, 207, 227 and 229
were traced and judged three more, and 184-231 the likeliest of them, none kept; 232-255 judged the search once
more, then 238 and 252 were traced and 184-255 judged the ordered knobs' correlated values, which 256-279 judged
unseen (kept; 274 and 276 traced after, and 184-255 judged Thompson sampling, not kept); 280-303 judged the
search once more, unchanged, with the answer after 12 trials, and 271 was traced; 184-255 judged a knowledge-
gradient search, which 304-327 judged unseen beside the search as it stands (not kept); 280-303 were traced for
trials spent on nothing new, and 328-351 judged unseen one measurement per command line (kept); 328 and 335
were traced, 304-351 judged a residual learned per campaign, which 352-375 judged unseen (not kept; 325 and 370
traced after); 304-351 judged every value of a knob as a move, which 376-399 judged unseen (kept; 389 traced
after); 388 was traced, 304-351 judged a trend in an ordered knob's prior, which 400-423 judged unseen (kept);
346 and 351 were traced, 304-351 judged the incumbent chosen by the models, which 424-447 judged unseen (not
kept; 436 traced after, and 304-351 judged a probe worth its expected gain, not kept); 446 was traced for the
luck replay froze, 304-351 judged fresh noise and then `again` on the models' doubt (not kept), and 448-471 judged
the search unseen with both replays (463 traced after); 472-495 judged it unseen once more (488 and 491 traced
after), and 304-351 and 424-495 a screening design offline (benchmarks/screening_design.py, not kept);
448-471 judged the prompt-only knobs' moves last, which 496-519 judged unseen (kept); 520-543 judged the search
unseen once more, unchanged in replays; 544-567 judged it unseen with the measured tables, 10 seeds, beside the
probe sized by the memory model's errors (kept: the same trials; benchmarks/results/search-efficiency.md), then
one GPU share down as a local move, developed on the H100 partial table (kept: the same trials seed by seed);
568-591 judged the search unseen with the measured tables, then the probe sized by the spread of the predicted
difference from the measured fit, developed on a GPU run (kept: the same trials on 84 of 85 table-budgets; 575 was
traced after); 592-615 judged the search unseen once more, with the measured tables; 616-623 once more (and an
anchored memory prediction, whose run did not finish: not kept); 624-647 once more; 648-671 once more, at
b9e5208, beside a seventh GPU table (h200-35b-spread) that no run had seen; 696-719, with slow processes planted
(--slow-processes), judged the search and a re-measurement of a move one process may have misled (not kept);
672-695 judged the search unseen at 12f5ae2, plain and with slow processes, beside that re-measurement (still not
kept: benchmarks/real_sweeps.py judged it by real sweeps), and 695 was traced after; 720-743 judged the search
unseen at 3e0b5fb beside a placement carried over to within its spread of the budget (not kept), developed on 686;
744-767 judged the search unseen at 21f5941 beside batch-size combinations after the others (not kept), developed
on 722; 768-791 judged it unseen at ced04ac, 781 was traced, and a peak carried over by the difference measured at
another share, developed there, was judged on 792-815 unseen and 744-767 (kept: the same trials on both);
815, 776 and 801 were traced, and 816-839 judged unseen, 3 seeds, the search beside a prompt-only knob's
unmeasured value first where it may buy a faster placement, developed on 776 (not kept); 840-863 judged the
search unseen at da56060, 10 seeds, fresh noise, beside random search with 100 trials; 863 was traced after;
864-887 judged it unseen at 4f5fdc5, 5 seeds, fresh noise, beside random search; 869, 876 and 887 traced after;
888-911 judged it unseen at 6176f66 (the search as at 4f5fdc5), 5 seeds, fresh noise, beside random search; 898,
904 and 908 traced after; 912-935 judged it unseen at e1d334b, 5 seeds, fresh noise, and then, with 936-959 unseen
and the traced 776, 869, 876, 887 and 908, a smaller ubatch's move to the faster share its carried peak may fit,
developed on 908 (kept); 947 traced after; 960-983 judged unseen, 5 seeds, fresh noise, the search at 703f93f
beside knob moves at an incumbent's own GPU share below the boundary, developed on the H100 partial table (kept:
the same trials seed by seed on all of them, and on 912-959), beside random search with 100 trials; 960-983
then judged a term per GPU share in the knob effects (not kept), and 984-1007 judged the search unseen at
cc6ea6a, 5 seeds, fresh noise, beside random search with 100 trials; 1008-1031 judged unseen, 5 seeds, fresh
noise, the exploration by Thompson sampling after the local moves (and one GPU share up from an incumbent below the
boundary), developed on the eighth measured table, beside the search at a0c4dc1 and random search with 100 trials;
1032-1055 judged the search unseen once more (its trials as at 878ef4f), 5 seeds, fresh noise, beside random search
with 100 trials, and 1040, 1041 and 1052 were traced after (1047 on one seed); 1008-1055 judged a reach to a
faster share never measured (developed on 1040), which 1056-1079 judged unseen beside the search before it and
random search with 100 trials (kept); 1080-1103 judged the search at 6f931b3 unseen, and 1087 was traced after;
1008-1055 judged one estimate of a knob move's memory for both carried peaks (kept) and 1008-1031 a re-measurement
of an incumbent after four trials short of it, developed on 1087 (not kept); 1104-1127 judged the kept one
unseen, 5 seeds, fresh noise, beside the search at 6f931b3 and random search with 100 trials, and 1080-1103 once more;
1128-1151 judged it unseen beside random search with 100 trials, and 1097 and 1128 were traced after;
1152-1175 judged the search unchanged, unseen, beside random search with 100 trials, and 1152 was traced after;
1176-1199 and 1200-1223 judged it unseen beside random search with 100 trials, and 1223 was traced after;
1224-1247, 1248-1271 and 1272-1295 judged it unseen likewise, and 1262, 1266 and 1279 were traced after;
1296-1319 judged it unseen likewise, and 1308 and 1310 were traced after; 1272-1319 judged every move ranked by its
expected improvement (not kept) and a reach ranked by its expected gain where that beats the likeliest move's,
which 1320-1343 judged unseen beside the search before it (kept); 1321 was traced after, and 1272-1343 judged a peak
measured over carried over without doubt to knob values that need no less (kept), which 1344-1367 judged unseen
beside the search before both and random search with 100 trials; 1368-1391 judged it unseen likewise; 1272-1319 and
1344-1391 judged a step down after two wrong memory predictions that spares the latest miss (kept; developed on an
H100 sweep and 1290-1293), which 1392-1415 judged unseen beside random search with 100 trials, and 1412 was traced
after; 1416-1439 judged the search unchanged, unseen, beside random search with 100 trials, and 1439 was traced
after; 1272-1319 judged an incumbent chosen by the models' belief instead of the fastest measurement and Thompson
sampling in the grid step, and with 1344-1391 in the model step (none kept); 1440-1463 judged the search unchanged,
unseen, beside random search with 100 trials, and 1461 and 1446 were traced after; 1464-1487 judged it unchanged,
unseen, likewise, and 1488-1511 too (1499 traced after), 1512-1535 (1531 and 1535 traced after) and 1536-1559
(1541 traced after), and 1272-1319 a combination of several knobs before the likeliest one-knob move (not kept);
1560-1583 judged the search unchanged, unseen, beside random search with 100 trials (1569 and 1573 traced after);
1584-1607 likewise (1589 and 1606 traced after), 1608-1631 (1608 and 1616 traced after), 1632-1655 (1642 traced
after), 1656-1679 (1660, 1665 and 1674 traced after), 1680-1703 (1691 and 1703 traced after),
1704-1727 (1707 and 1715 traced after) and 1728-1751 (1737 and 1748 traced after); 1752-1775 judged unseen the
memory model's mean fitted to follow the measured peaks, with 1272-1319 and 1680-1751 (kept; 1754, 1772, 1774 and
1289 traced after); 1776-1799 judged the search unchanged, unseen, beside random search with 100 trials (1785
and 1796 traced after), and 1800-1823, 1824-1847, 1848-1871 and 1872-1895 likewise (1818, 1834, 1842, 1854 and
1878 traced after), and 1896-1919, 1920-1943 (1929 and 1936 traced after), 1944-1967, 1968-1991
(1990 traced after), 1992-2015, 2016-2039 (2025 traced after), 2040-2063 (2050 traced after), 2064-2087
(2073 traced after), 2088-2111 (2104 traced after), 2112-2135 (2114 traced after) and 2136-2159 likewise;
2160-2183 judged the serving context's memory model (flash attention auto counted as on, the attention mask), unseen,
beside the search before it (the same trials on 56 of 59 table-budgets), and 2184-2207, 2208-2231, 2232-2255,
2256-2279, 2280-2303, 2304-2327, 2328-2351, 2352-2375, 2376-2399, 2400-2423, 2424-2447, 2448-2471, 2472-2495,
2496-2519, 2520-2543, 2544-2567, 2568-2591, 2592-2615, 2616-2639, 2640-2663, 2664-2687, 2688-2711, 2712-2735 and
2736-2759 likewise; 2760-2783 have random search's run.
Budgets per table come from --budget (MiB, repeatable), else the table's .meta.json "budgets_mib", else those of
8, 12 and 16 GiB that some but not all of its rows fit; a table without a memory column is searched without a
budget. A median counts a seed that never reached the target as trials + 1, so a ratio to random search whose
median is censored there is larger than the true ratio: --random-trials gives random search a longer budget of its
own. "Rows at target" says how many feasible rows are within 98% of the best (on synthetic tables mostly 1-3 of
hundreds to thousands: a needle, which random search rarely draws). On synthetic tables the "oracle" says how many
trials a search that knew every row's noise-free value would need to draw one (oracle_trials): where it needs more
than the target, the row-based target asks for luck, which the summary counts.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from synthetic_tables import synthetic_table

from autoinfer.engines.replay import configurations, noise_free_path, parameter_columns, read_table
from autoinfer.errors import UserError
from autoinfer.search.effects import numeric
from autoinfer.search.shares import GPU_SHARE
from autoinfer.sweep.replay_cli import (
    ANSWER_AT,
    TARGET,
    Goals,
    SeedRun,
    StrategyResult,
    answer_shown,
    answer_worth,
    goals,
    print_results,
    run_seed,
    strategy_result,
)

TABLES = Path(__file__).resolve().parent / "tables"
STRATEGIES = ("boundary", "informed", "random")
DEFAULT_STRATEGIES = ("boundary", "random")
GIB = (8192, 12288, 16384)
REPORT_SEEDS = range(2760, 2784)  # synthetic tables never looked at while developing the search
TARGET_TRIALS = 12
TARGET_RATIO = 0.25
BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


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
    ap.add_argument("--no-measured", action="store_true", help="leave out the tables under benchmarks/tables")
    ap.add_argument("--budget", type=float, action="append", default=[], help="memory budget in MiB (repeatable)")
    ap.add_argument("--seeds", type=int, default=10, help="runs per strategy, table and budget")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--random-trials", type=int,
                    help="random search's own trial budget (default --trials): where its target is a few rows of "
                         "thousands, a cap at --trials censors its median and the ratio is only an upper bound")
    ap.add_argument("--synthetic", type=int, action="append",
                    help=f"synthetic table seed (repeatable; default {REPORT_SEEDS.start}-{REPORT_SEEDS.stop - 1})")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--objective", default="tg", choices=["tg", "pp", "balanced"])
    ap.add_argument("--strategy", action="append", choices=STRATEGIES,
                    help=f"strategies to run (repeatable; default: {', '.join(DEFAULT_STRATEGIES)}; the ratio needs "
                         "boundary and random)")
    ap.add_argument("--fresh-noise", action="store_true",
                    help="synthetic tables: each run draws a new process's noise around the row's noise-free speed, "
                         "as a real re-measurement would, instead of replaying the row's one measurement (measured "
                         "tables replay their rows either way)")
    ap.add_argument("--slow-processes", action="store_true",
                    help="synthetic tables with slow processes planted: a process of one knob value (threads where "
                         "there are threads) runs slow as a whole by chance (benchmarks/synthetic_tables.py, "
                         "plant_slow_processes); with --fresh-noise every run draws its own")
    ap.add_argument("--quiet", action="store_true", help="only the summary, not each table's results")
    ap.add_argument("--out", type=Path, help="also write the results as JSON")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes: tables are generated and the seeds of every (table, budget) case run in parallel "
                         "(results as one)")
    args = ap.parse_args(argv)
    console = Console(width=200)
    scratch = tempfile.TemporaryDirectory(prefix="synthetic-tables-")
    tables = [] if args.no_measured else list(args.table or sorted(TABLES.glob("*.csv")))
    if not tables and args.no_synthetic:
        ap.error("no tables: --no-measured and --no-synthetic leave nothing to search")
    started = time.monotonic()
    if args.jobs > 1:  # a process per core: their BLAS threads would only contend (a spawned process reads these
        for name in BLAS_THREADS:  # as it starts; a forked one keeps its parent's threads)
            os.environ.setdefault(name, "1")
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) if args.jobs > 1 else nullcontext() as pool:
        run = pool.map if pool is not None else map
        if not args.no_synthetic:
            seeds = args.synthetic or list(REPORT_SEEDS)
            tables += list(run(synthetic_table, [Path(scratch.name)] * len(seeds), seeds,
                               [args.slow_processes] * len(seeds)))
        cases = [(table, budget) for table in tables for budget in budgets_for(table, args.budget)]
        try:  # every case's targets before any run: a budget no row fits is an error now, not a worker's traceback
            goal = {(table, budget): scored(table, budget, args.objective) for table, budget in cases}
        except UserError as e:
            console.print(f"error: {e}", markup=False, highlight=False)
            return 2
        runs = [(table, budget, strategy, seed) for table, budget in cases for strategy in strategies(args)
                for seed in range(args.seeds)]  # one unit of work per seed: a slow table's seeds share the cores
        done = dict(zip(runs, run(run_unit, *zip(*runs), [args] * len(runs))))
    summary = []
    for table, budget in cases:
        row, results, best = case_row(table, budget, args, goal[(table, budget)], done)
        if not args.quiet:
            console.print(f"\n[bold]{table.name}[/bold]  budget {budget or 'none'} MiB  "
                          f"{args.seeds} seeds × ≤{args.trials} trials"
                          + (f" (random ≤{args.random_trials})" if args.random_trials else ""))
            print_results(console, results, best, args.objective)
        summary.append(row)
    print_tables(console, summary)
    print_budgets(console, summary)
    if args.fresh_noise:
        console.print("synthetic tables replayed with fresh noise: every run a new process's draw around its row's "
                      "noise-free speed")
    console.print(f"wall time {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def strategies(args: argparse.Namespace) -> list[str]:
    """The strategies to run, in the order they are reported."""
    return args.strategy or list(DEFAULT_STRATEGIES)


def trials_of(strategy: str, args: argparse.Namespace) -> int:
    """A strategy's trial budget: random search's own where --random-trials gives one."""
    return args.random_trials if strategy == "random" and args.random_trials else args.trials


def scored(table: Path, budget: float | None, objective: str) -> Goals:
    """The table's targets at a budget, with its noise-free values where its generator wrote them."""
    free = noise_free_path(table)
    return goals(table, objective, budget, pd.read_csv(free) if free.is_file() else None)


@functools.lru_cache(maxsize=8)
def _scored(table: Path, budget: float | None, objective: str) -> Goals:
    """scored(), read once per process for the seeds of one case it runs in a row."""
    return scored(table, budget, objective)


def run_unit(table: Path, budget: float | None, strategy: str, seed: int,
             args: argparse.Namespace) -> tuple[SeedRun, float]:
    """One seed of one strategy on one table and budget: (run_seed's answer, its seconds)."""
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    started = time.monotonic()
    fresh = args.fresh_noise and noise_free_path(table).is_file()
    ran = run_seed(table, strategy, seed, budget, trials_of(strategy, args), args.objective,
                   _scored(table, budget, args.objective), fresh)
    return ran, time.monotonic() - started


def case_row(table: Path, budget: float | None, args: argparse.Namespace, goal: Goals,
             done: dict[tuple, tuple]) -> tuple[dict, list[StrategyResult], float]:
    """Every strategy on one table and budget from its seeds' runs: (the summary row, the strategies' results, the
    best row's value)."""
    results = []
    for strategy in strategies(args):
        units = [done[(table, budget, strategy, seed)] for seed in range(args.seeds)]
        results.append(strategy_result(strategy, [u[0] for u in units], sum(u[1] for u in units),
                                       trials_of(strategy, args), goal.reference is not None))
    at_target, feasible, oracle = haystack(goal)
    by = {r.strategy: r for r in results}
    ratio = by["boundary"].median / by["random"].median if {"boundary", "random"} <= set(by) else None
    row = {"table": table.name, "kind": kind_of(table, goal.reference is not None), "budget_mib": budget,
           "best": goal.best, "rows_at_target": at_target, "feasible_rows": feasible, "oracle": oracle,
           "traps": traps(goal), "neighbour_traps": traps(goal, neighbours=True), "ratio": ratio,
           **{r.strategy: {"trials": r.budget, "median": r.median, "median_noise_free": r.median_noise_free,
                           "trials_needed": list(r.trials_needed),
                           "trials_needed_noise_free": list(r.trials_needed_noise_free or []),
                           "not_run": list(r.skipped), "wall_s": round(r.wall_s, 1),
                           "answer": list(r.answer), "answer_median": r.answer_median, "over": list(r.over)}
              for r in results}}
    return row, results, goal.best


def haystack(goal: Goals) -> tuple[int, int, float | None]:
    """(feasible configurations within 98% of the best, feasible configurations, the oracle's trials): how many
    needles the haystack holds, and how soon a search that knew every row's noise-free value and peak would draw one
    (None without noise-free values). A configuration is a row, or the rows of its processes."""
    hit = goal.target >= TARGET * goal.best
    oracle = None if goal.reference is None else oracle_trials(goal.reference, hit)
    config = configurations(goal.df)
    return int(config[hit].nunique()), int(config[goal.target.notna()].nunique()), oracle


def traps(goal: Goals, neighbours: bool = False) -> int | None:
    """Feasible configurations of the knobs other than the GPU share, each at its fastest feasible share by noise-free
    value, that no change of one knob's value makes faster yet are worth less than TARGET of the best: where a search
    that moves one knob at a time can stop short, and only combinations or luck go on. `neighbours`: an ordered
    knob moves to its neighbouring values only (the boundary search's moves before 2026-11-27 on axes of up to six
    values). None without noise-free values."""
    if goal.reference is None:
        return None
    knobs = knob_columns(goal)
    if not knobs:
        return 0
    fastest = fastest_combinations(goal, knobs)
    levels = {k: sorted(goal.df[k].dropna().unique().tolist(), key=lambda v: (str(type(v)), v)) for k in knobs}

    def moves(key: tuple) -> list[tuple]:
        out = []
        for i, knob in enumerate(knobs):
            values = levels[knob]
            if neighbours and numeric(values):
                j = values.index(key[i])
                values = [values[n] for n in (j - 1, j + 1) if 0 <= n < len(values)]
            out += [key[:i] + (v,) + key[i + 1:] for v in values if v != key[i]]
        return [m for m in out if m in fastest]

    best = max(fastest.values())
    return sum(v < TARGET * best and all(fastest[m] <= v for m in moves(key)) for key, v in fastest.items())


def knob_columns(goal: Goals) -> list[str]:
    """The searched parameters other than the GPU share."""
    return [c for c in parameter_columns(goal.df) if c not in GPU_SHARE]


def fastest_combinations(goal: Goals, knobs: list[str]) -> dict[tuple, float]:
    """Each feasible combination of the knobs' values at its fastest feasible GPU share, by noise-free value."""
    value = goal.reference.groupby([goal.df[k] for k in knobs]).max().dropna()
    return {key if isinstance(key, tuple) else (key,): v for key, v in value.items()}


def oracle_trials(free: pd.Series, hit: pd.Series, draws: int = 201) -> float:
    """Median trials to the first row at the row target for a search that measures the feasible rows from the best
    noise-free value down, ties in random order. Each row's noise is drawn alike and apart from the others', so a
    row's chance to be lifted to the target rises with its noise-free value, and measuring in that order is what
    draws one soonest on average: where even this needs more than the target, the row-based target asks for luck."""
    feasible = free.notna()
    values, at_target = free[feasible].to_numpy(), hit[feasible].to_numpy()
    rng = np.random.default_rng(0)
    firsts = [int(np.argmax(at_target[np.lexsort((rng.random(len(values)), -values))])) + 1 for _ in range(draws)]
    return float(statistics.median(firsts))


def kind_of(table: Path, synthetic: bool) -> str:
    """synthetic (a generator's, with noise-free values), planted (a formula in benchmarks/tables) or measured."""
    if synthetic:
        return "synthetic"
    meta = table.with_suffix(".meta.json")
    planted = meta.is_file() and "planted" in str(json.loads(meta.read_text()).get("source", ""))
    return "planted" if planted else "measured"


def shown(median: float | None, trials: int) -> str:
    if median is None:
        return "—"
    return f"{median:g}" if median <= trials else f">{trials}"


def print_tables(console: Console, summary: list[dict]) -> None:
    """One line per table and budget."""
    out = Table(title="median measured trials to 98% of the best feasible row (>N: half the seeds did not reach it "
                      "within N); rows at target: feasible rows within 98% of the best; oracle: trials for a search "
                      "that knows every noise-free value, measuring the best first")
    ran = [s for s in STRATEGIES if s in summary[0]]
    for col in ("table", "budget MiB", "rows at target", "oracle", *ran, "boundary, noise-free", "boundary/random",
                *(f"{s} answer after {ANSWER_AT}" for s in ran)):
        out.add_column(col)
    for row in summary:
        out.add_row(row["table"], f"{row['budget_mib']:.0f}" if row["budget_mib"] else "none",
                    f"{row['rows_at_target']} of {row['feasible_rows']}",
                    "—" if row["oracle"] is None else f"{row['oracle']:g}",
                    *(shown(row[s]["median"], row[s]["trials"]) for s in ran),
                    shown(row["boundary"]["median_noise_free"], row["boundary"]["trials"])
                    if "boundary" in row else "—",
                    ratio_shown(row), *(answer_shown(tuple(row[s]["answer"])) for s in ran))
    console.print(out)


def ratio_shown(row: dict) -> str:
    """boundary/random, marked as a bound where a median is censored at its trial budget (both censored: unknown)."""
    if row["ratio"] is None:
        return "—"
    over = {s: row[s]["median"] > row[s]["trials"] for s in ("boundary", "random")}
    if over["boundary"] and over["random"]:
        return "?"
    return f"{'≤ ' if over['random'] else '≥ ' if over['boundary'] else ''}{row['ratio']:.2f}"


def answers_shown(rows: list[dict]) -> str:
    """The boundary search's answer after ANSWER_AT trials over tables: the median of the per-table medians, the
    worst table's median and the worst seed of any table, in percent of the best feasible row."""
    medians = [r["boundary"]["answer_median"] for r in rows]
    worst = min(rows, key=lambda r: r["boundary"]["answer_median"])
    seeds = answer_worth(a for r in rows for a in r["boundary"]["answer"])
    return (f"{statistics.median(medians):.1%} ({worst['boundary']['answer_median']:.1%} {worst['table']}; "
            f"worst seed {min(seeds):.1%})")


def over_shown(rows: list[dict]) -> str:
    """Trials the boundary search measured over the memory budget among its first ANSWER_AT: the mean per run over
    tables, the worst table's mean and the most in any run."""
    means = {r["table"]: statistics.mean(r["boundary"]["over"]) for r in rows}
    worst = max(means, key=means.get)
    most = max(n for r in rows for n in r["boundary"]["over"])
    return f"{statistics.mean(means.values()):.2f} ({means[worst]:.2f} {worst}; most {most})"


def print_budgets(console: Console, summary: list[dict]) -> None:
    """Per budget and kind of table: the median over tables and the worst table, against the targets."""
    if "boundary" not in summary[0]:
        return
    trials = summary[0]["boundary"]["trials"]
    random_trials = summary[0].get("random", summary[0]["boundary"])["trials"]
    out = Table(title=f"boundary search per budget: median over tables (worst table) of the per-table median trials; "
                      f"targets ≤ {TARGET_TRIALS} trials and ≤ {TARGET_RATIO} of random")
    for col in ("tables", "budget MiB", "n", "trials to 98% of best row", "noise-free", "boundary/random",
                f"answer after {ANSWER_AT}", f"over the budget in {ANSWER_AT}"):
        out.add_column(col)
    met = True
    for kind in ("measured", "planted", "synthetic"):
        for budget in sorted({r["budget_mib"] or 0 for r in summary if r["kind"] == kind}):
            rows = [r for r in summary if r["kind"] == kind and (r["budget_mib"] or 0) == budget]
            medians = [r["boundary"]["median"] for r in rows]
            worst = max(rows, key=lambda r: r["boundary"]["median"])
            free = [r["boundary"]["median_noise_free"] for r in rows if r["boundary"]["median_noise_free"] is not None]
            worst_free = max(free, default=None)
            ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
            worst_ratio = max(rows, key=lambda r: r["ratio"] or 0.0)
            met &= worst["boundary"]["median"] <= TARGET_TRIALS and (not ratios or max(ratios) <= TARGET_RATIO)
            out.add_row(kind, f"{budget:.0f}" if budget else "none", str(len(rows)),
                        f"{statistics.median(medians):g} ({shown(worst['boundary']['median'], trials)} "
                        f"{worst['table']})",
                        f"{statistics.median(free):g} ({shown(worst_free, trials)})" if free else "—",
                        f"{statistics.median(ratios):.2f} ({max(ratios):.2f} {worst_ratio['table']})"
                        if ratios else "—", answers_shown(rows), over_shown(rows) if budget else "—")
    console.print(out)
    console.print(f"targets {'met' if met else 'missed'} on the row-based count: every table ≤ {TARGET_TRIALS} "
                  f"trials and ≤ {TARGET_RATIO} of random's median (random's median is censored at {random_trials + 1} "
                  "where it never got there)")
    above = [r for r in summary if r["boundary"]["median"] > TARGET_TRIALS]
    luck = sum(r["oracle"] is not None and r["oracle"] > TARGET_TRIALS for r in above)
    console.print(f"answer after {ANSWER_AT}: the fastest configuration measured in the first {ANSWER_AT} trials "
                  "(unconfirmed), by its noise-free value where the table has them, as a share of the best feasible "
                  "row's: median over tables of the per-table median (worst table; worst single seed)")
    console.print(f"over the budget in {ANSWER_AT}: measured trials over the memory budget among the first "
                  f"{ANSWER_AT}, the mean per run over tables (worst table's mean; most in one run)")
    free = [r for r in summary if r["boundary"]["median_noise_free"] is not None]
    console.print(f"above {TARGET_TRIALS} trials: {len(above)} of {len(summary)} table-budgets by rows"
                  + (f" ({luck} where the oracle needs more too)" if luck else "")
                  + (f", {sum(r['boundary']['median_noise_free'] > TARGET_TRIALS for r in free)} of {len(free)} "
                     "noise-free" if free else ""))
    if free and free[0].get("traps") is not None:
        console.print(trap_account(free))


def trap_account(rows: list[dict]) -> str:
    """Noise-free trial counts split by whether the table-budget has a trap (traps()): how much of what misses the
    target is where moving one knob at a time stops short of it."""
    parts = []
    for label, has_trap in (("with a trap", True), ("without", False)):
        counts = [r["boundary"]["median_noise_free"] for r in rows if bool(r["traps"]) == has_trap]
        parts.append(f"{label} {len(counts)}, median {statistics.median(counts):g} trials, "
                     f"{sum(c > TARGET_TRIALS for c in counts)} above {TARGET_TRIALS}" if counts else f"{label} none")
    return (f"noise-free, table-budgets with a trap (a configuration worth < {TARGET:.0%} of the best that no change "
            "of one knob's value makes faster): " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
