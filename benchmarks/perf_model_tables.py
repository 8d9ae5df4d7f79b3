"""The performance model against the power law and the bandwidth model, on every measured table.

The search's performance model (autoinfer/model/performance.py: seconds per token from the weight bytes each side
reads, threads and whole layers left on the CPU) was written before these tables were measured and is not tuned to
any of them. Here each family is fitted to each table's tg medians as `autoinfer analyze` fits a study: AICc over
the terms the rows determine, 5-fold hold-out MAPE per configuration with its standard error (a configuration's
processes are held out together and scored by their median: autoinfer/analysis/fits.py). Target (the search issue): on the GPU
tables, AICc selects the performance model over the power law and its hold-out MAPE is at most 10%.

    python benchmarks/perf_model_tables.py                  # every table under benchmarks/tables/
    python benchmarks/perf_model_tables.py --out benchmarks/results/perf-model-tables.md

Each table goes through `autoinfer import` (its .meta.json `fixed` parameters into every row, its .shape.json as the
rows' model, so the 35B tables need no GGUF here) and is fitted by `analyze`'s own fit_study: one path from a
table to the numbers. Planted tables (a formula plus noise, not a measurement) are listed but marked.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import optuna
from search_efficiency import kind_of

from autoinfer.analysis import fits as F
from autoinfer.analysis.dataset import add_to_study, load_frame
from autoinfer.analysis.importers import read_file
from autoinfer.analysis.report import FitSet, fit_study
from autoinfer.engines.replay import shape_path

TABLES = Path(__file__).resolve().parent / "tables"
FAMILIES = ("power_law", "bandwidth", "performance")
SAME_AICC = 0.05  # AICc closer than this is one fit written twice (a nested model whose extra terms fit zero)
NESTED = ("The bandwidth model is the performance model without its threads and whole-layer terms. Where the extra "
          "terms fit zero the two are one fit (same AICc, same hold-out error: `bandwidth = performance`); where "
          "they lower the error by less than their AICc cost, AICc names the bandwidth model. A difference under 2 "
          "is no evidence either way. The target is the performance model against the power law (a negative "
          "difference: the performance model is preferred) with its hold-out error. The hold-out error is per "
          "configuration: where a table measured several processes of one (`process` column), they leave the "
          "training folds together and are scored by their median, since no model of a configuration predicts one "
          "process's luck; on the other tables a configuration is one row.\n")


def fitted(table: Path) -> FitSet:
    """The table imported into a study of its own, fitted as `autoinfer analyze` fits a study."""
    study = optuna.create_study(direction="maximize")
    add_to_study([read_file(table)], study)
    return fit_study(load_frame(study))


def cell(fit: F.Fit | None, skipped: str | None) -> str:
    if fit is None:
        return f"not fitted: {skipped}"
    return f"AICc {fit.aicc:.1f}, k={fit.k}, hold-out {fit.holdout_mape:.1f} ± {fit.holdout_se:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, action="append", help="table(s); default: benchmarks/tables/*.csv")
    ap.add_argument("--out", type=Path, help="also write the table as Markdown")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lines = ["| table | rows | power law | bandwidth | performance | AICc picks | performance − power law AICc "
             "| performance hold-out ≤ 10% |", "|---|---|---|---|---|---|---|---|"]
    for table in args.table or sorted(TABLES.glob("*.csv")):
        if not shape_path(table).is_file():
            print(f"{table.name}: no .shape.json, skipped")
            continue
        planted = kind_of(table, synthetic=False) == "planted"
        fits = fitted(table)
        real = {n: f for n, f in fits.fits.items() if math.isfinite(f.aicc)}
        low = min((f.aicc for f in real.values()), default=math.nan)
        pick = " = ".join(n for n, f in real.items() if f.aicc - low < SAME_AICC) or "none"
        perf, power = fits.fits.get("performance"), real.get("power_law")
        target = (f"{'yes' if perf.holdout_mape <= 10 else 'no'}" if perf is not None else "not fitted")
        versus = f"{perf.aicc - power.aicc:+.1f}" if perf is not None and power is not None else "no power law"
        name = table.name + (" (planted, not measured)" if planted else "")
        lines.append(f"| {name} | {len(fits.rows)} | "
                     + " | ".join(cell(fits.fits.get(n), fits.skipped.get(n)) for n in FAMILIES)
                     + f" | {pick} | {versus} | {target} |")
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("# Performance model vs power law vs bandwidth model, per table (tg)\n\n"
                            "Written by benchmarks/perf_model_tables.py.\n\n" + "\n".join(lines) + "\n\n" + NESTED)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
