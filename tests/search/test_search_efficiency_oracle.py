"""The benchmark's oracle: how many trials a search that knew every noise-free value would need to draw a row at
the row target (benchmarks/search_efficiency.py), which says where that target asks for luck rather than search."""

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
