"""The benchmark's oracle: how many trials a search that knew every noise-free value would need to draw a row at
the row target, which says where that target asks for luck rather than search; and its traps, configurations where
moving one knob at a time stops short of the best (benchmarks/search_efficiency.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _oracle(monkeypatch, free: list[float], hit: list[bool]) -> float:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from search_efficiency import oracle_trials

    return oracle_trials(pd.Series(free), pd.Series(hit))


def test_the_oracle_counts_feasible_rows_from_the_best_noise_free_value_down(monkeypatch):
    """The row lifted to the target is the third best noise-free one; an infeasible row (NaN) ranks nowhere."""
    free = [100.0, np.nan, 99.0, 98.0, 97.0]
    assert _oracle(monkeypatch, free, [False, True, False, True, True]) == 3


def test_tied_rows_are_drawn_in_random_order(monkeypatch):
    """Two rows tie at the top (a knob with no effect on tg); only one is lifted to the target: 1 or 2 draws."""
    result = _oracle(monkeypatch, [100.0, 100.0, 90.0], [False, True, False])
    assert result in (1.0, 2.0)
    assert _oracle(monkeypatch, [100.0, 100.0, 90.0], [False, False, True]) == 3


def _traps(monkeypatch, tmp_path, free: dict, neighbours: bool = False) -> int:
    """traps() on a table of threads × K cache whose rows all fit, with the given noise-free tg per row."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from search_efficiency import traps

    from autoinfer.sweep.replay_cli import goals

    rows = [{"threads": t, "type_k": k, "tg": 1.0, "pp": 1.0, "vram_mib": 1000.0} for t, k in free]
    pd.DataFrame(rows).to_csv(tmp_path / "t.csv", index=False)
    noise_free = pd.DataFrame({"tg": list(free.values()), "pp": [1.0] * len(free)})
    return traps(goals(tmp_path / "t.csv", "tg", 2000.0, noise_free), neighbours)


def test_a_trap_is_a_configuration_no_single_move_improves_short_of_the_best(monkeypatch, tmp_path):
    """16 threads with q8_0 beats every configuration one knob's value away (16 with f16, other threads with q8_0)
    and is 4% short of 4 threads with f16: a trap, whichever values are moves. 12 threads with f16, faster than
    8 and 16 with f16 but short of 4, is one only where an ordered knob moves to its neighbours alone."""
    free = {(4, "f16"): 100.0, (8, "f16"): 80.0, (12, "f16"): 85.0, (16, "f16"): 90.0,
            (4, "q8_0"): 70.0, (8, "q8_0"): 70.0, (12, "q8_0"): 70.0, (16, "q8_0"): 96.0}
    assert _traps(monkeypatch, tmp_path, free) == 1
    assert _traps(monkeypatch, tmp_path, free, neighbours=True) == 1
    free[(16, "q8_0")], free[(12, "f16")] = 70.0, 95.0
    assert _traps(monkeypatch, tmp_path, free) == 0
    assert _traps(monkeypatch, tmp_path, free, neighbours=True) == 1
