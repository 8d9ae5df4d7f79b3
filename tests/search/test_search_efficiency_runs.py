"""The benchmark runs each seed as its own unit of work (benchmarks/search_efficiency.py), so a slow table's seeds
share the cores: its answers must be compare()'s, and a budget no row fits must stop it before any run. Its synthetic
tables list one measurement per llama.cpp command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from autoinfer.engines.replay import noise_free_path
from autoinfer.sweep.replay_cli import compare

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_benchmarks_seed_by_seed_runs_answer_what_compare_does(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from search_efficiency import main
    from synthetic_tables import synthetic_table

    table = synthetic_table(tmp_path, 3)
    budget = json.loads(table.with_suffix(".meta.json").read_text())["budgets_mib"][0]
    out = tmp_path / "out.json"
    assert main(["--table", str(table), "--no-synthetic", "--budget", str(budget), "--seeds", "2",
                 "--random-trials", "8", "--quiet", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    free = pd.read_csv(noise_free_path(table))
    for strategy, trials in (("boundary", 30), ("random", 8)):
        (expected,), best = compare(table, [strategy], 2, budget, trials, "tg", free)
        assert row[strategy]["trials_needed"] == list(expected.trials_needed), strategy
        assert row[strategy]["trials_needed_noise_free"] == list(expected.trials_needed_noise_free), strategy
        assert row[strategy]["answer"] == list(expected.answer) and len(expected.answer) == 2, strategy
        assert row[strategy]["over"] == list(expected.over) and len(expected.over) == 2, strategy
        assert row["best"] == best


def test_a_budget_no_row_fits_is_a_one_line_error_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from search_efficiency import main

    table = BENCHMARKS / "tables" / "h100-35b.csv"
    assert main(["--table", str(table), "--no-synthetic", "--budget", "100", "--seeds", "1"]) == 2
    printed = capsys.readouterr().out.strip()
    assert printed.count("\n") == 0 and "no row of" in printed and "100" in printed, printed


def test_a_synthetic_table_lists_one_measurement_per_command_line(tmp_path, monkeypatch):
    """Rows llama.cpp runs alike (a placement pattern with no layer's experts in RAM, or every layer's) are one
    configuration: with a noise draw each, a table's best row was the luckiest twin (synthetic-338 at 16 GiB)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from synthetic_tables import synthetic_table

    table = synthetic_table(tmp_path, 338)
    df = pd.read_csv(table).assign(free=pd.read_csv(noise_free_path(table))["tg"])
    n_layers = int(df["cpu_expert_layers"].max())
    moot = df[df["cpu_expert_layers"].isin([0, n_layers])]
    others = [c for c in df.columns if c not in ("placement", "tg", "pp", "tg_samples", "pp_samples", "vram_mib", "free")]
    twins = moot.groupby(others)
    assert twins.ngroups < len(moot)  # each moot configuration is listed under every pattern
    assert (twins["placement"].nunique() == df["placement"].nunique()).all()
    assert (twins["tg_samples"].nunique() == 1).all() and (twins["pp_samples"].nunique() == 1).all()
    assert (twins["free"].nunique() == 1).all()  # one true speed, too
    # where the pattern matters, the rows are measurements of their own
    assert df[~df.index.isin(moot.index)].groupby(others)["tg_samples"].nunique().gt(1).any()


def test_slow_processes_are_planted_on_the_fastest_rows_value_and_nowhere_else(tmp_path, monkeypatch):
    """The same table with slow processes: the fastest noise-free row's threads value has a chance of slow
    processes in the sidecar; some of its rows (one process each) are slow by that factor, tg and pp; every other
    row and every noise-free speed is the plain table's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from synthetic_tables import synthetic_table

    plain, slow = synthetic_table(tmp_path, 0), synthetic_table(tmp_path, 0, slow_processes=True)
    assert slow.name == "synthetic-0-slow.csv" and "threads" in pd.read_csv(plain)
    assert json.loads(slow.with_suffix(".meta.json").read_text())["source"] == "synthetic seed 0, with slow processes"
    a, b = pd.read_csv(plain), pd.read_csv(slow)
    free_a, free_b = pd.read_csv(noise_free_path(plain)), pd.read_csv(noise_free_path(slow))
    assert free_a.equals(free_b.drop(columns=["slow_share", "slow_log"]))
    value = a.loc[free_a["tg"].idxmax(), "threads"]
    planted = b["threads"] == value
    assert (free_b["slow_share"][planted] > 0).all() and (free_b["slow_share"][~planted] == 0).all()
    factor = math.exp(-free_b["slow_log"][planted].iloc[0])
    changed = a["tg"] != b["tg"]
    assert changed.any() and not (changed & ~planted).any()
    assert b["tg"][changed].to_numpy() == pytest.approx(factor * a["tg"][changed].to_numpy(), rel=1e-6)
    assert b["pp"][changed].to_numpy() == pytest.approx(factor * a["pp"][changed].to_numpy(), rel=1e-6)
    assert a.drop(columns=["tg", "pp", "tg_samples", "pp_samples"]).equals(
        b.drop(columns=["tg", "pp", "tg_samples", "pp_samples"]))
