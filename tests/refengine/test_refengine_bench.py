"""benchmarks/refengine_bench.py's pure-Python parts on the CPU: llama-bench's JSON, ratio intervals, a report that
records failures and skips and keeps going, and real interleaved rounds of engine configurations and llama-bench
on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from autoinfer.model.synth import cached_model

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "refengine_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("refengine_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_llama_bench_json_gives_pp_and_tg_samples(bench):
    records = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0, "samples_ts": [880.0, 920.0]},
               {"n_prompt": 0, "n_gen": 64, "avg_ts": 61.0, "samples_ts": [60.0, 62.0]}]
    got = bench.parse_llama_bench("ggml_cuda_init: found 1 CUDA device\n" + json.dumps(records))
    assert got == {"pp": [880.0, 920.0], "tg": [60.0, 62.0]}


def test_ratio_interval_contains_the_ratio(bench):
    r, lo, hi = bench.ratio_ci([10.0, 11.0, 12.0, 10.5], [5.0, 5.5, 5.2])
    assert r == pytest.approx(10.75 / 5.2) and lo <= r <= hi and hi - lo < 1.0


def test_report_records_failures_and_skips_and_writes_as_it_goes(bench, tmp_path):
    report = bench.Report(tmp_path, limit_s=60)
    report.run("fine", lambda part: part.lines.append("measured"))
    report.run("broken", lambda part: 1 / 0)
    report.run("too long", lambda part: part.lines.append("never"), need_s=3600)
    assert [p.status for p in report.parts] == ["ok", "failed", "skipped"]
    assert "ZeroDivisionError" in report.parts[1].reason and "needs ~3600 s" in report.parts[2].reason
    text = (tmp_path / "refengine-bench.md").read_text()
    assert "## fine: ok" in text and "measured" in text and "## broken: failed" in text and "never" not in text
    assert json.loads((tmp_path / "refengine-bench.json").read_text())["parts"][1]["status"] == "failed"


@pytest.mark.slow
def test_rounds_interleave_engine_configurations_with_llama_bench(bench, llama_tools):
    model = cached_model("tiny", "Q8_0")
    loaded = {"dense": bench.load_weights(model, "dense", pin=False, dtype="fp32", device="cpu")}
    engines = bench.build_engines(loaded, {"chunk": {}, "naive": dict(gdn="naive", moe="loop")}, dtype="fp32",
                                  device="cpu")
    assert engines["chunk"].model.w.lm_head.data_ptr() == engines["naive"].model.w.lm_head.data_ptr()  # shared
    samples = bench.engine_rounds(engines, model, llama_tools.tool("llama-bench"), ["-t", "1"], rounds=2, reps=2,
                                  n_prompt=16, n_gen=4)
    assert set(samples) == {"chunk", "naive", "llama.cpp"}
    assert all(len(s["tg"]) == 4 and len(s["pp"]) == 4 and min(s["tg"] + s["pp"]) > 0 for s in samples.values())
    table = bench.speed_table(samples, floor_tg=1e4)
    assert len(table) == 5 and "(" in table[2] and table[-1].startswith("| llama.cpp")
    lines = bench.compare_logits(engines, list(range(3, 20)), 3)
    assert lines[-1].startswith("| naive |") and lines[-1].endswith("3/3 |")
