"""benchmarks/make_table.py with the real llama-bench: a table of several processes per configuration replays."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from autoinfer.engines import base
from autoinfer.engines.base import RunContext, TrialConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_every_configuration_is_measured_in_each_round_of_processes(llama_tools, tiny_model, tmp_path, monkeypatch):
    """--processes 3 on a grid of two configurations: three rounds, each the whole grid, a row per process numbered
    0-2 in `process`, the rounds one after another; replay then answers a configuration from one of its three."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from make_table import main

    out = tmp_path / "processes.csv"
    assert main(["--model", str(tiny_model), "--out", str(out), "--grid", "ubatch=32,64", "--fixed",
                 "n_gpu_layers=0", "threads=1", "--n-prompt", "32", "--n-gen", "8", "--repetitions", "2",
                 "--processes", "3"]) == 0
    df = pd.read_csv(out)
    assert len(df) == 6 and set(df.outcome) == {"ok"}
    assert list(df.process) == [0, 0, 1, 1, 2, 2]  # round by round: drift in time falls on rounds, not on a knob
    assert sorted(df.groupby("ubatch").process.apply(sorted).tolist()) == [[0, 1, 2], [0, 1, 2]]
    assert json.loads(out.with_suffix(".meta.json").read_text())["processes"] == 3
    engine = base.create("replay", table=str(out), seed=1)
    assert set(engine.knobs) == {"ubatch"}
    ctx = RunContext(timeout_s=1, artifacts=tmp_path)
    rows = {engine.run(TrialConfig(model=Path("m"), n_gpu_layers=0, ubatch=64, repetitions=2), ctx).metrics["replay_row"]
            for _ in range(30)}
    assert rows == set(df.index[df.ubatch == 64])
