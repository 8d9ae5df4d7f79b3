"""How measured tables and synthetic ones are built: noise, knob interactions, GPU shares beyond the boundary.

The synthetic tables (synthetic_tables.py) judge the search on structure it was not built on; they are only a fair
judge where their structure is like measured llama.cpp data. Per table, on log(tg):

- noise: the standard deviation of a row's repetitions (pooled over rows), and of its median;
- main: the residual standard deviation after the GPU share (cpu_expert_layers) and every other knob's value,
  each knob's effect allowed to depend on the GPU share (threads matter more with more experts in RAM);
- pairs: the same with every pair of knobs interacting, the share of the residual variance the pairs explain and
  the F-test's p-value (a small p: interactions the data can see);
- effects: each knob value's effect on log(tg) against the knob's first value, ± two standard errors, in the
  main-effects model (threads' effect at the mean GPU share);
- peaks: the largest difference in peak VRAM between rows that differ only in knobs that allocate nothing on the
  GPU (threads, load mode): measurement noise of the peak;
- beyond the boundary: for each combination of the other knobs and budget, whether a GPU share that keeps more
  experts in RAM than the largest one that fits measured faster with the same knobs (a lucky row or a real effect),
  as the share of combinations and the largest ratio.

With --retest A B (one grid measured twice, as make_table.py writes it), per pair: how far one configuration's tg
moves between two processes (the SD of the matched rows' log ratio, and over √2 one process's), whether its pp moves
with it (the correlation of the two log ratios: a process's luck shared by both), and how far each run's host
drifted (the lowest and highest mean, over DRIFT_ROWS rows in measurement order, of log(tg) minus the mean of its
GPU share): what the repetitions inside one process do not show.

    python benchmarks/table_structure.py                        # the GPU tables + synthetic seeds 0-7
    python benchmarks/table_structure.py --synthetic 100 --synthetic 101
    python benchmarks/table_structure.py --table benchmarks/tables/h100-35b-repack.csv \
        --retest benchmarks/tables/h100-35b-repack.csv benchmarks/tables/h100-35b-repack-retest.csv
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from synthetic_tables import synthetic_table

from autoinfer.engines.replay import parameter_columns, read_table
from autoinfer.errors import UserError
from autoinfer.search.boundary import DEVICE_NEUTRAL, MEMORY_NEUTRAL

TABLES = Path(__file__).resolve().parent / "tables"
SHARE = ("n_gpu_layers", "cpu_expert_layers")
GIB = (8192, 12288, 16384)
DRIFT_ROWS = 20  # consecutive rows of one run (a few minutes of a GPU table) whose mean residual shows drift


def _design(df: pd.DataFrame, knobs: list[str], pairs: list[tuple[str, str]]) -> np.ndarray:
    """One-hot columns (first level dropped) for the GPU share, each knob, and each listed pair's products."""
    cols = [np.ones(len(df))]

    def levels(c: str) -> list:
        return sorted(df[c].unique(), key=str)[1:]

    for c in ["cpu_expert_layers", *knobs]:
        cols += [(df[c] == v).to_numpy(float) for v in levels(c)]
    for a, b in pairs:
        cols += [((df[a] == va) & (df[b] == vb)).to_numpy(float) for va in levels(a) for vb in levels(b)]
    return np.array(cols).T


def _residual(x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r = y - x @ coef
    return float(r @ r), len(y) - np.linalg.matrix_rank(x)


def _effects(df: pd.DataFrame, knobs: list[str], y: np.ndarray) -> list[str]:
    """'knob a→b: estimate ± 2 SE' of log(tg) in the model with the GPU share and each knob's own effect."""
    x = _design(df, knobs, [])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r = y - x @ coef
    dof = len(y) - np.linalg.matrix_rank(x)
    cov = (r @ r / dof) * np.linalg.pinv(x.T @ x)
    out, i = [], df["cpu_expert_layers"].nunique()  # the intercept and the GPU share's columns come first
    for knob in knobs:
        levels = sorted(df[knob].unique(), key=str)
        for j, value in enumerate(levels[1:]):
            out.append(f"{knob} {levels[0]}→{value}: {coef[i + j]:+.3f} ± {2 * math.sqrt(cov[i + j, i + j]):.3f}")
        i += len(levels) - 1
    return out


def structure(table: Path, budgets: list[float]) -> dict:
    df = read_table(table)
    if "outcome" in df:
        df = df[df["outcome"].fillna("ok") == "ok"]
    if "n_gpu_layers" in df:
        df = df[df["n_gpu_layers"] == df["n_gpu_layers"].max()]  # expert placements: the GPU share is one axis
    knobs = [c for c in parameter_columns(df) if c not in SHARE and df[c].nunique() > 1]
    y = np.log(df["tg"].to_numpy(float))
    samples = [np.log(np.array(s.split(), float)) for s in df["tg_samples"].astype(str)]
    n = int(np.median([len(s) for s in samples]))
    noise = math.sqrt(np.mean([np.var(s, ddof=1) for s in samples if len(s) > 1]))
    share_knob = [("cpu_expert_layers", k) for k in knobs]
    rss_main, dof_main = _residual(_design(df, knobs, share_knob), y)
    effects = _effects(df, knobs, y)
    rss_pairs, dof_pairs = _residual(_design(df, knobs, share_knob + list(itertools.combinations(knobs, 2))), y)
    extra = dof_main - dof_pairs
    f = ((rss_main - rss_pairs) / extra) / (rss_pairs / dof_pairs) if extra and dof_pairs else math.nan
    allocating = [c for c in parameter_columns(df) if c not in MEMORY_NEUTRAL | DEVICE_NEUTRAL]
    peaks = df.groupby(allocating)["vram_mib"].agg(lambda v: v.max() - v.min())
    out = {"table": table.name, "rows": len(df), "knobs": ", ".join(knobs), "samples": n,
           "peak_spread_mib": float(peaks.max()), "effects": effects,
           "noise_sd": noise, "median_sd": noise / math.sqrt(n),
           "main_sd": math.sqrt(rss_main / dof_main), "pairs_sd": math.sqrt(rss_pairs / dof_pairs),
           "pairs_explain": 1 - rss_pairs / rss_main, "pairs_p": float(stats.f.sf(f, extra, dof_pairs)),
           "beyond": []}
    for budget in budgets:
        fit = df[df["vram_mib"] <= budget]
        ratios = []
        for _, group in (fit.groupby(knobs) if knobs else [((), fit)]):
            if len(group) > 1:
                edge = group.loc[group["vram_mib"].idxmax()]
                ratios.append(group.drop(edge.name)["tg"].max() / edge["tg"])
        if ratios:
            r = np.array(ratios)
            out["beyond"].append({"budget_mib": budget, "combinations": len(r), "faster": float((r > 1).mean()),
                                  "faster_5pct": float((r > 1.05).mean()), "max_ratio": float(r.max())})
    return out


def retest(first: Path, second: Path) -> dict:
    """The same grid measured twice (module docstring)."""
    runs = [read_table(path) for path in (first, second)]
    if not all("cpu_expert_layers" in df for df in runs):
        raise UserError(f"{first.name} and {second.name}: --retest needs a cpu_expert_layers column in both, the GPU "
                        "share each run's drift is measured within (make_table.py --grid cpu_expert_layers=...)")
    keys = parameter_columns(runs[0])
    matched = runs[0].merge(runs[1], on=keys, suffixes=("_a", "_b"))
    if len(matched) < 2:
        raise UserError(f"{first.name} and {second.name} share {len(matched)} configurations; --retest takes one "
                        "grid measured twice (make_table.py with the same --grid and --fixed)")
    ratio = np.log(matched["tg_b"] / matched["tg_a"])
    pp_ratio = np.log(matched["pp_b"] / matched["pp_a"])

    def drift(df: pd.DataFrame) -> tuple[float, float]:
        y = np.log(df["tg"])
        window = (y - y.groupby(df["cpu_expert_layers"]).transform("mean")).rolling(DRIFT_ROWS).mean()
        return float(window.min()), float(window.max())

    return {"tables": f"{first.name} / {second.name}", "rows": len(matched), "sd": float(ratio.std()),
            "largest": float(ratio.abs().max()), "pp_correlation": float(np.corrcoef(ratio, pp_ratio)[0, 1]),
            "drift": [drift(df) for df in runs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, action="append",
                    help="table(s); default: the measured GPU tables with knobs beside the GPU share")
    ap.add_argument("--synthetic", type=int, action="append", help="synthetic seeds (default 0-7)")
    ap.add_argument("--retest", type=Path, nargs=2, action="append", metavar=("FIRST", "SECOND"),
                    help="one grid measured twice: the spread between processes and each run's drift")
    ap.add_argument("--out", type=Path, help="also write the tables as Markdown")
    args = ap.parse_args(argv)
    try:
        retests = [retest(a, b) for a, b in args.retest or []]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scratch = tempfile.TemporaryDirectory(prefix="synthetic-tables-")
    tables = list(args.table or [TABLES / "h100-35b-knobs.csv", TABLES / "h100-35b-load.csv"])
    tables += [synthetic_table(Path(scratch.name), s) for s in (args.synthetic or range(8))]
    results = []
    for table in tables:
        meta = table.with_suffix(".meta.json")
        budgets = json.loads(meta.read_text()).get("budgets_mib") if meta.is_file() else None
        results.append(structure(table, [float(b) for b in budgets or GIB]))
    lines = ["| table | rows | knobs | repetitions | noise sd (row median) | residual sd: main effects | "
             "+ knob pairs | pairs explain | F-test p | peak spread MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['table']} | {r['rows']} | {r['knobs']} | {r['samples']} | {r['noise_sd']:.3f} "
                     f"({r['median_sd']:.3f}) | {r['main_sd']:.3f} | {r['pairs_sd']:.3f} | "
                     f"{100 * r['pairs_explain']:.0f}% | {r['pairs_p']:.2g} | {r['peak_spread_mib']:.0f} |")
    lines += ["", "| table | budget MiB | knob combinations | a share beyond the boundary measured faster | "
              "by > 5% | largest ratio |", "|---|---|---|---|---|---|"]
    for r in results:
        for b in r["beyond"]:
            lines.append(f"| {r['table']} | {b['budget_mib']:.0f} | {b['combinations']} | {100 * b['faster']:.0f}% | "
                         f"{100 * b['faster_5pct']:.0f}% | {b['max_ratio']:.2f} |")
    lines += ["", "| table | knob effects on log(tg) at a fixed GPU share (± 2 SE) |", "|---|---|"]
    lines += [f"| {r['table']} | {'; '.join(r['effects'])} |" for r in results]
    if retests:
        lines += ["", f"| tables | matched rows | log ratio sd (one process) | largest log ratio | pp moves with it "
                      f"(r) | drift over {DRIFT_ROWS} rows: first run | second run |", "|---|---|---|---|---|---|---|"]
        for r in retests:
            lines.append(f"| {r['tables']} | {r['rows']} | {r['sd']:.3f} ({r['sd'] / math.sqrt(2):.3f}) | "
                         f"{r['largest']:.2f} | {r['pp_correlation']:.2f} | "
                         + " | ".join(f"{lo:+.3f} / {hi:+.3f}" for lo, hi in r["drift"]) + " |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
