"""The benchmark runs each seed as its own unit of work (benchmarks/search_efficiency.py), so a slow table's seeds
share the cores: its answers must be compare()'s, and a budget no row fits must stop it before any run. Its synthetic
tables list one measurement per llama.cpp command line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

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
