"""The performance model's threads terms on measured tables: more threads split the CPU-side work and add
synchronisation, so it can say where more threads got slower (a loaded two-core host) and where they helped (an
H100 host with experts in RAM)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from autoinfer.engines.base import TrialConfig
from autoinfer.engines.replay import parameter_columns, read_table, shape_path
from autoinfer.model import performance
from autoinfer.model.shape import ModelShape

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables"


def _fitted(name: str) -> tuple[np.ndarray, pd.DataFrame, list[np.ndarray]]:
    """The tg model fitted without a prior to every row of a measured table; the rows and their features."""
    table = TABLES / name
    shape = ModelShape.from_json(shape_path(table).read_text())
    fixed = json.loads(table.with_suffix(".meta.json").read_text())["fixed"]
    df = read_table(table)
    rows = [performance.features_of(shape, TrialConfig.from_params(
        {"model": "m", **fixed, **{c: r[c] for c in parameter_columns(df)}})).tg_row() for _, r in df.iterrows()]
    return performance.fit(np.array(rows), df["tg"].to_numpy(float)), df, rows


def _predicted_by_threads(name: str) -> dict[int, float]:
    coef, df, rows = _fitted(name)
    predicted = performance.predict(coef, np.array(rows))
    return {int(t): float(np.median(predicted[df["threads"].to_numpy() == t])) for t in sorted(df["threads"].unique())}


def test_two_threads_slower_than_one_on_the_loaded_two_core_host():
    measured = read_table(TABLES / "cpu-tiny.csv").groupby("threads")["tg"].median()
    assert measured[2] < 0.5 * measured[1]  # the table: two threads 10-40x slower
    predicted = _predicted_by_threads("cpu-tiny.csv")
    assert predicted[2] < predicted[1]


def test_sixteen_threads_faster_than_eight_with_experts_in_ram_on_the_h100_host():
    predicted = _predicted_by_threads("h100-35b-knobs.csv")
    assert predicted[16] > predicted[8]


def test_the_priors_put_the_best_thread_count_at_a_server_s_physical_cores():
    """Before any trial, the model prefers SYNC_OPTIMUM_THREADS (16) threads for CPU-side experts."""
    def tg(threads: int) -> float:
        f = performance.Features(cpu_gb=1.0, gpu_gb=1.0, cpu_total_gb=10.0, cpu_layers=0, threads=threads, ubatch=512)
        return float(performance.predict(np.array(performance.TG_PRIOR), f.tg_row()[None])[0])

    assert performance.SYNC_OPTIMUM_THREADS == 16
    assert tg(8) < tg(12) < tg(16) > tg(24) > tg(32)
