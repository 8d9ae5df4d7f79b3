"""benchmarks/server_memory.py on the CPU build and the tiny model: llama-bench, the printed llama-server and the
server at its default slots, interleaved, one peak each per round (RSS without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autoinfer.model.synth import cached_model
from autoinfer.trial_config import TrialConfig

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_memory.py"


def test_the_three_programs_peaks_are_measured_and_set_against_llama_benchs(tmp_path, llama_tools):
    config = TrialConfig(cached_model("tiny", "Q8_0"), n_gpu_layers=0, threads=1, n_prompt=64, n_gen=8,
                         repetitions=1, batch=64, ubatch=32)
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"config": config.to_params()}))
    env = {**os.environ, "AUTOINFER_LLAMA_BIN": str(llama_tools.bin_dir), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT), str(answer), "--rounds", "2"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:5] for line in done.stdout.splitlines()
            if line.startswith("| llama-")}
    assert list(rows) == ["llama-bench", "llama-server -np 1 (printed)", "llama-server, default slots"]
    assert all(float(median) > 1 for median, _, _ in rows.values())
    assert rows["llama-bench"][2].strip() == "+0"
