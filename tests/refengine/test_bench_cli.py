"""`autoinfer engine bench`: a table row per op variant and engine configuration, errors against the reference."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from autoinfer.cli import app


@pytest.mark.parametrize("misses", ["copy", "cpu"])
def test_engine_bench_prints_variants_errors_and_floors(hf_gguf, misses):
    result = CliRunner().invoke(app, ["engine", "bench", "--model", str(hf_gguf), "--n-prompt", "128", "--n-gen",
                                      "2", "--reps", "1", "--threads", "1", "--expert-slots", "6", "--misses", misses,
                                      "--prefill-chunk", "64"])  # snapshots every 64 tokens: half the prompt reused
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"measured bandwidth [0-9.]+ GB/s; 6 expert slots", out)
    for op, variant in (("gdn T=128", "chunk"), ("moe N=1", "grouped"), ("moe N=128", "grouped"),
                        ("engine pp128", "gdn=chunk moe=grouped"), ("engine tg2", "gdn=chunk moe=grouped")):
        line = next(ln for ln in out.splitlines() if op in ln and variant in ln)
        error = float(re.search(r"│\s*([0-9.]+e[-+][0-9]+)\s*│", line).group(1))
        assert error <= 1e-4, line
    assert "expert hit rate" in out
    assert ("misses computed on the host" in out) == (misses == "cpu")
    snapshot = next(ln for ln in out.splitlines() if "snapshot resume" in ln)
    assert re.search(r"│\s*0\.0e\+00\s*│", snapshot), snapshot  # resumed logits equal the cold run's exactly
    assert "64/128 tokens reused" in snapshot and "hits 1" in snapshot
    assert out.count("reference") >= 4  # gdn, moe ×2, engine pp/tg reference rows
