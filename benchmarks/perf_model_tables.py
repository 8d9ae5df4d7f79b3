"""The performance model against the power law and the bandwidth model, on every measured table.

The search's performance model (autoinfer/model/performance.py: seconds per token from the weight bytes each side
reads, threads and whole layers left on the CPU) was written before these tables were measured and is not tuned to
any of them. Here each family is fitted to each table's tg medians as `autoinfer analyze` fits a study: AICc over
the terms the rows determine, 5-fold hold-out MAPE with its standard error. Target (the search issue): on the GPU
tables, AICc selects the performance model over the power law and its hold-out MAPE is at most 10%.

    python benchmarks/perf_model_tables.py                  # every table under benchmarks/tables/
    python benchmarks/perf_model_tables.py --out benchmarks/results/perf-model-tables.md

Each row's configuration is the table's `fixed` parameters (.meta.json) with the row's own; the byte accounting
comes from the table's .shape.json, so the 35B tables need no GGUF here. Planted tables (a formula plus noise, not
a measurement) are listed but marked.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from autoinfer.analysis import fits as F
from autoinfer.engines.base import TrialConfig
from autoinfer.engines.replay import parameter_columns, read_table, shape_path
from autoinfer.model.performance import features_of
from autoinfer.model.shape import ModelShape

TABLES = Path(__file__).resolve().parent / "tables"
FAMILIES = ("power_law", "bandwidth", "performance")


def features(table: Path) -> pd.DataFrame:
    """The table's successful rows with the byte-accounting features of their configurations."""
    meta_path = table.with_suffix(".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    shape = ModelShape.from_json(shape_path(table).read_text())
    df = read_table(table)
    if "outcome" in df:
        df = df[df["outcome"].fillna("ok") == "ok"]
    df = df[df["tg"].notna() & (df["tg"] > 0)]
    rows = []
    for _, r in df.iterrows():
        params = {**meta.get("fixed", {}), **{c: r[c] for c in parameter_columns(df) if pd.notna(r[c])}}
        for name in ("n_gpu_layers", "n_cpu_moe", "cpu_expert_layers", "threads", "ubatch", "batch"):
            if name in params:
                params[name] = int(params[name])
        f = features_of(shape, TrialConfig.from_params({"model": "table", **params}))
        rows.append({"cpu_total_gb": f.cpu_total_gb, "cpu_gb": f.cpu_gb, "gpu_gb": f.gpu_gb,
                     "cpu_layers": f.cpu_layers, "threads": f.threads, "tg": float(r["tg"])})
    return pd.DataFrame(rows)


def fit_all(frame: pd.DataFrame) -> dict[str, F.Fit | str]:
    calls = {
        "power_law": lambda: F.fit_power_law(frame["cpu_total_gb"], frame["tg"]),
        "bandwidth": lambda: F.fit_bandwidth(frame["cpu_gb"], frame["gpu_gb"], frame["tg"]),
        "performance": lambda: F.fit_performance(frame["cpu_gb"], frame["gpu_gb"], frame["cpu_layers"],
                                                 frame["threads"], frame["tg"]),
    }
    out: dict[str, F.Fit | str] = {}
    for name, call in calls.items():
        try:
            out[name] = call()
        except ValueError as exc:
            out[name] = f"not fitted: {exc}"
    return out


def cell(fit: F.Fit | str) -> str:
    if isinstance(fit, str):
        return fit
    return f"AICc {fit.aicc:.1f}, k={fit.k}, hold-out {fit.holdout_mape:.1f} ± {fit.holdout_se:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, action="append", help="table(s); default: benchmarks/tables/*.csv")
    ap.add_argument("--out", type=Path, help="also write the table as Markdown")
    args = ap.parse_args(argv)
    lines = ["| table | rows | power law | bandwidth | performance | AICc picks | performance hold-out ≤ 10% |",
             "|---|---|---|---|---|---|---|"]
    for table in args.table or sorted(TABLES.glob("*.csv")):
        if not shape_path(table).is_file():
            print(f"{table.name}: no .shape.json, skipped")
            continue
        meta_path = table.with_suffix(".meta.json")
        planted = "planted" in json.loads(meta_path.read_text()).get("source", "") if meta_path.is_file() else False
        frame = features(table)
        fitted = fit_all(frame)
        real = {n: f for n, f in fitted.items() if isinstance(f, F.Fit) and math.isfinite(f.aicc)}
        pick = min(real, key=lambda n: real[n].aicc) if real else "none"
        perf = fitted["performance"]
        target = (f"{'yes' if perf.holdout_mape <= 10 else 'no'}" if isinstance(perf, F.Fit) else "not fitted")
        name = table.name + (" (planted, not measured)" if planted else "")
        lines.append(f"| {name} | {len(frame)} | " + " | ".join(cell(fitted[n]) for n in FAMILIES)
                     + f" | {pick} | {target} |")
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("# Performance model vs power law vs bandwidth model, per table (tg)\n\n"
                            "Written by benchmarks/perf_model_tables.py.\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
