"""The offline screening design the boundary search is compared with (benchmarks/screening_design.py): its design
identifies every knob value's main effect, and the regression after it goes to the best of a table whose knobs act
alone."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
KEYS = list(itertools.product([4, 8, 16], ["f16", "q8_0", "q4_0"], ["mmap", "none"]))


def _module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import screening_design

    return screening_design


def test_a_saturated_design_identifies_every_main_effect(monkeypatch):
    """Threads × K cache × load mode: an intercept and 2 + 2 + 1 value columns; a design of as many combinations as
    columns, chosen from random subsets by det XᵀX, has them all independent."""
    sd = _module(monkeypatch)
    x = sd.main_effects(KEYS)
    assert x.shape == (18, 6)
    design = sd.d_optimal(x, x.shape[1], np.random.default_rng(0))
    assert len(set(design)) == 6
    assert np.linalg.matrix_rank(x[design]) == 6


def test_after_the_design_the_regression_measures_the_best_of_an_additive_table(monkeypatch):
    """Each value multiplies the speed by its own factor and the measurements are nearly exact: the combination the
    main effects rank first is the best (16 threads, q4_0, none), measured right after the design unless the design
    drew it. The next best is 10% slower, so only the best is at the target."""
    sd = _module(monkeypatch)
    factor = {4: 0.8, 8: 0.9, 16: 1.0, "f16": 0.85, "q8_0": 0.9, "q4_0": 1.0, "mmap": 0.8, "none": 1.0}
    y = np.log([np.prod([factor[v] for v in key]) for key in KEYS])
    x = sd.main_effects(KEYS)
    for seed in range(5):
        trials = sd.trials_to_target(x, y, 1e-8, x.shape[1], np.random.default_rng(seed), cap=30)
        assert trials <= x.shape[1] + 1
    assert sd.trials_to_target(x, y, 1e-8, 0, np.random.default_rng(0), cap=30) <= 6


def test_a_target_never_measured_within_the_cap_counts_as_cap_plus_one(monkeypatch):
    """The best is one combination whose values are each the worst alone (a trap no main effect points to), and the
    cap is shorter than the table: the run is censored at cap + 1, as search_efficiency.py counts it."""
    sd = _module(monkeypatch)
    y = np.array([-0.5 if key[0] == 16 or key[1] == "q4_0" or key[2] == "none" else 0.0 for key in KEYS])
    y[KEYS.index((16, "q4_0", "none"))] = 1.0
    x = sd.main_effects(KEYS)
    assert sd.trials_to_target(x, y, 1e-8, 0, np.random.default_rng(0), cap=3) == 4


def test_the_oracle_ranks_by_main_effects_fitted_to_the_whole_table(monkeypatch):
    """Knobs that act alone: the whole table's main effects rank the best first. The best made of values that are
    each the worst alone, 5% ahead of the rest: those effects rank it last of all 18. (Far enough ahead, its own
    row pulls the fitted effects its way: the oracle knows the target's value too.)"""
    sd = _module(monkeypatch)
    x = sd.main_effects(KEYS)
    additive = np.array([0.1 * (key[0] == 16) + 0.1 * (key[1] == "q4_0") for key in KEYS])
    assert sd.oracle_rank(x, additive) == 1
    trap = np.array([-0.5 if key[0] == 16 or key[1] == "q4_0" or key[2] == "none" else 0.0 for key in KEYS])
    trap[KEYS.index((16, "q4_0", "none"))] = 0.05
    assert sd.oracle_rank(x, trap) == 18


def test_bad_results_files_are_one_line_errors(monkeypatch, tmp_path, capsys):
    """A missing file, a file that is not JSON, JSON that is no results list and results on measured tables only
    (no noise-free values to score against): exit 2 with one line naming the fix, no traceback."""
    sd = _module(monkeypatch)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "dict.json").write_text('{"table": "t.csv"}')
    measured = [{"table": "h100-35b.csv", "kind": "measured", "budget_mib": 8192.0,
                 "boundary": {"median_noise_free": None}}]
    (tmp_path / "measured.json").write_text(json.dumps(measured))
    for name in ("missing.json", "bad.json", "dict.json", "measured.json"):
        assert sd.main([str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and "give" in err
