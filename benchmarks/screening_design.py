"""A main-effects screening design in place of the one-knob moves, judged offline on the synthetic tables of a
search_efficiency.py results file: would a balanced design (every knob value measured in several contexts) find the
traps the one-knob moves miss, and what would it cost on the other tables?

A trap is a knob combination no one-knob move improves that is short of the best (search_efficiency.traps): the
moves from it only look worse, because its neighbours' values interact with the incumbent's. A design that varies
every knob in several contexts estimates each value's effect averaged over the others, which is what a regression
over the whole table sees (the oracle line: the rank, by that regression of the noise-free values, of the first
combination at the target). Each strategy here measures its design, then, one trial at a time, the combination not yet measured that
a ridge regression of log speed on the knob values' main effects ranks first (prior autoinfer.search.effects.
PRIOR_SD), until one is within 98% of the best feasible noise-free value:
- none: no design, the regression from the first trial on;
- saturated: first a D-optimal design of 1 + Σ(values − 1) combinations, as many as the main effects (the best
  of 200 random subsets by det XᵀX);
- saturated + 2.

Each knob combination is taken at its fastest feasible GPU share by noise-free value: the placement comes free,
which favours the design (the boundary search spends trials finding it). A measurement is the noise-free speed
with one process's shift and the mean of three repetitions, drawn with the SDs the generator wrote (as
search_efficiency.py --fresh-noise replays). Printed beside the boundary search's noise-free medians from the file.

    python benchmarks/screening_design.py benchmarks/results/search-efficiency-304-351-fresh-noise.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from search_efficiency import TARGET_TRIALS, fastest_combinations, knob_columns, scored
from synthetic_tables import synthetic_table

from autoinfer.engines.replay import noise_free_path
from autoinfer.search.effects import PRIOR_SD
from autoinfer.sweep.replay_cli import TARGET

DESIGNS = {"none": None, "saturated": 0, "saturated + 2": 2}  # combinations beyond the saturated design (None: none)
REPETITIONS = 3  # a trial's repetitions, as search_efficiency.py runs them (the campaign default)
SUBSETS = 200  # random subsets a D-optimal design is chosen from
ORACLE = "oracle: whole-table main effects"


def knob_speeds(table: Path, budget: float) -> tuple[list[tuple], np.ndarray, float]:
    """(knob combinations, log noise-free speed of each at its fastest feasible share, a measurement's variance)."""
    goal = scored(table, budget, "tg")
    fastest = fastest_combinations(goal, knob_columns(goal))
    sds = pd.read_csv(noise_free_path(table)).iloc[0]
    variance = sds["tg_process_sd"] ** 2 + sds["tg_repetition_sd"] ** 2 / REPETITIONS
    return list(fastest), np.log(np.array(list(fastest.values()))), float(variance)


def main_effects(keys: list[tuple]) -> np.ndarray:
    """Design matrix: an intercept and one column per knob value but the first of each knob."""
    columns = [np.ones(len(keys))]
    for i in range(len(keys[0])):
        for value in sorted({k[i] for k in keys}, key=str)[1:]:
            columns.append(np.array([k[i] == value for k in keys], dtype=float))
    return np.column_stack(columns)


def d_optimal(x: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """n rows of x whose main effects are estimated best: the best of SUBSETS random subsets by log det XᵀX."""
    ridge = 1e-6 * np.eye(x.shape[1])
    subsets = [rng.choice(len(x), n, replace=False) for _ in range(SUBSETS)]
    return list(max(subsets, key=lambda s: np.linalg.slogdet(x[s].T @ x[s] + ridge)[1]))


def trials_to_target(x: np.ndarray, y: np.ndarray, variance: float, design: int, rng: np.random.Generator,
                     cap: int) -> int:
    """Trials until a measured combination is at the noise-free target (cap + 1 if none is within cap)."""
    hit = y >= np.log(TARGET) + y.max()
    order = d_optimal(x, design, rng) if design else []
    precision = np.eye(x.shape[1]) * variance / PRIOR_SD ** 2
    precision[0, 0] = 0.0  # the level of the speeds is not a knob's effect
    measured: dict[int, float] = {}
    while len(measured) < min(cap, len(y)):
        if len(measured) >= len(order):
            rows = list(measured)
            a, b = x[rows], np.array([measured[i] for i in rows])
            beta = np.linalg.lstsq(a.T @ a + precision, a.T @ b, rcond=None)[0] if rows else np.zeros(x.shape[1])
            order.append(next(int(i) for i in np.argsort(-(x @ beta), kind="stable") if int(i) not in measured))
        i = order[len(measured)]
        measured[i] = y[i] + rng.normal(0.0, np.sqrt(variance))
        if hit[i]:
            return len(measured)
    return cap + 1


def oracle_rank(x: np.ndarray, y: np.ndarray) -> int:
    """Where the first combination at the noise-free target comes in the order of a main-effects regression fitted
    to every combination's noise-free value: what knowing the averaged effects exactly would cost."""
    hit = y >= np.log(TARGET) + y.max()
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    return int(np.argmax(hit[np.argsort(-(x @ beta), kind="stable")])) + 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="search_efficiency.py --out files (synthetic tables)")
    ap.add_argument("--seeds", type=int, default=8, help="runs per strategy, table and budget")
    ap.add_argument("--trials", type=int, default=30, help="trials before a run counts as never reaching it")
    ap.add_argument("--out", type=Path, help="also write the results as JSON")
    args = ap.parse_args(argv)
    cases = []
    for path in args.results:
        try:
            cases += json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: {path} is not a readable results file ({exc.__class__.__name__}); give a file "
                  "search_efficiency.py --out wrote", file=sys.stderr)
            return 2
    if not cases or not all(isinstance(c, dict) and {"table", "kind", "budget_mib"} <= set(c) for c in cases):
        print("error: the results files hold no search_efficiency.py results; give files its --out wrote",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in cases:
            search = case.get("boundary", {}).get("median_noise_free")
            if case["kind"] != "synthetic" or case["budget_mib"] is None or search is None:
                continue
            table = Path(folder) / case["table"]
            if not table.is_file():
                synthetic_table(Path(folder), int(table.stem.split("-")[1]))
            keys, y, variance = knob_speeds(table, case["budget_mib"])
            x = main_effects(keys)
            row = {"table": case["table"], "budget_mib": case["budget_mib"], "traps": case["traps"],
                   "combinations": len(keys), "boundary search": search, ORACLE: oracle_rank(x, y)}
            for name, extra in DESIGNS.items():
                size = 0 if extra is None else min(x.shape[1] + extra, len(keys))
                row[name] = statistics.median(trials_to_target(x, y, variance, size, np.random.default_rng(s),
                                                               args.trials) for s in range(args.seeds))
            rows.append(row)
    if not rows:
        print("error: no synthetic table in these results has a noise-free median; give search_efficiency.py results "
              "on synthetic tables", file=sys.stderr)
        return 2
    summary = Table(title=f"trials to 98% of the best noise-free value ({len(rows)} table-budgets, medians of "
                          f"{args.seeds} seeds; the designs get the placement free)")
    for column in ("strategy", "mean", "median", f"above {TARGET_TRIALS}", "worst", "with a trap: above"):
        summary.add_column(column)
    trapped = [r for r in rows if r["traps"]]
    for name in ("boundary search", *DESIGNS, ORACLE):
        values = [r[name] for r in rows]
        summary.add_row(name, f"{statistics.fmean(values):.2f}", f"{statistics.median(values):g}",
                        str(sum(v > TARGET_TRIALS for v in values)), f"{max(values):g}",
                        f"{sum(r[name] > TARGET_TRIALS for r in trapped)} of {len(trapped)}")
    Console().print(summary)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
