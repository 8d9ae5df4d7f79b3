"""A grid measured twice (benchmarks/table_structure.py --retest): the spread of one configuration between two
processes, and a run's drift in measurement order, which the repetitions inside one process do not show."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_retest_reports_the_spread_between_processes_and_each_runs_drift(monkeypatch, tmp_path):
    """20 GPU shares × two K caches at 100 tok/s, then again with every f16 row 10% slow (measured first, in a row)
    and every q8_0 row 10% fast, pp with them by half as much: each row moves by 0.1 in log, pp in step, and the
    retest's first 20 rows sit 0.1 under their shares' means while the first run has no drift."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from table_structure import retest

    grid = [(layers, kind) for kind in ("f16", "q8_0") for layers in range(20)]
    first = pd.DataFrame({"cpu_expert_layers": [g[0] for g in grid], "type_k": [g[1] for g in grid], "tg": 100.0,
                          "pp": 500.0, "vram_mib": 1000.0})
    second = first.assign(tg=[100.0 * math.exp(-0.1 if kind == "f16" else 0.1) for _, kind in grid],
                          pp=[500.0 * math.exp(-0.05 if kind == "f16" else 0.05) for _, kind in grid])
    first.sample(frac=1.0, random_state=0).to_csv(tmp_path / "a.csv", index=False)
    second.to_csv(tmp_path / "b.csv", index=False)
    result = retest(tmp_path / "a.csv", tmp_path / "b.csv")
    assert result["rows"] == 40
    assert result["sd"] == pytest.approx(0.1 * math.sqrt(40 / 39))
    assert result["largest"] == pytest.approx(0.1)
    assert result["pp_correlation"] == pytest.approx(1.0)  # pp slow and fast in the same processes as tg
    assert np.allclose(result["drift"][0], (0.0, 0.0))
    assert result["drift"][1] == pytest.approx((-0.1, 0.1))


def test_retest_of_two_different_grids_or_a_missing_table_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    """Two tables with no configuration in common, a table that does not exist, or tables without the GPU share the
    drift is measured within: exit 2 before any table is analysed, one line naming the fix."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from table_structure import main

    for name, layers in (("a.csv", [0, 1]), ("b.csv", [2, 3])):
        pd.DataFrame({"cpu_expert_layers": layers, "tg": 1.0, "pp": 1.0}).to_csv(tmp_path / name, index=False)
    pd.DataFrame({"threads": [1, 2], "tg": 1.0, "pp": 1.0}).to_csv(tmp_path / "no-share.csv", index=False)
    for second in ("b.csv", "missing.csv", "no-share.csv"):
        assert main(["--retest", str(tmp_path / "a.csv"), str(tmp_path / second)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err
