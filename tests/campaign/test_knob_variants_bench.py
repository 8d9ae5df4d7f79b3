"""benchmarks/knob_variants.py on the CPU build and the tiny model: a configuration and its one-knob variants,
interleaved, each variant's ratio to it with a CI, as two samples and by round; bad --vary and --budget get one line
and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autoinfer.model.synth import cached_model
from autoinfer.trial_config import TrialConfig

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "knob_variants.py"


def _run(args: list[str], llama_tools) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOINFER_LLAMA_BIN": str(llama_tools.bin_dir), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_each_variant_runs_with_its_flag_and_is_set_against_the_configuration(tmp_path, llama_tools):
    config = TrialConfig(cached_model("tiny", "Q8_0"), n_gpu_layers=0, threads=1, n_prompt=32, n_gen=8,
                         repetitions=1)
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"config": config.to_params()}))
    done = _run([str(answer), "--vary", "poll=0,100", "--vary", "threads=2", "--rounds", "2"], llama_tools)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sum(line.startswith("round ") for line in done.stdout.splitlines()) == 2 * 4
    rows = {line.split("|")[1].strip(): line.split("|")[2:8] for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| configuration")}
    assert list(rows) == ["as given", "poll=0", "poll=100", "threads=2"]
    assert [c.strip() for c in rows["as given"][2:]] == ["—"] * 4
    assert all(float(tg) > 0 and "[" in ratio and "[" in by_round
               for tg, _, ratio, _, by_round, _ in list(rows.values())[1:])


def test_a_vs_fit_result_needs_one_of_its_budgets(tmp_path, llama_tools):
    result = tmp_path / "vs-fit.json"
    result.write_text(json.dumps([{"budget_mib": 8192.0, "ours": {"model": "m.gguf"}}]))
    done = _run([str(result), "--vary", "poll=100"], llama_tools)
    assert done.returncode == 2 and "name one of its budgets with --budget" in done.stderr
    done = _run([str(result), "--budget", "4096", "--vary", "poll=100"], llama_tools)
    assert done.returncode == 2 and "has no budget 4096: it has 8192" in done.stderr
    done = _run([str(result), "--budget", "8192", "--vary", "poll"], llama_tools)
    assert done.returncode == 2 and "write KNOB=V1,V2" in done.stderr


def test_a_file_that_is_not_an_answer_is_one_line(tmp_path, llama_tools):
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    done = _run([str(junk), "--vary", "poll=100"], llama_tools)
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
    done = _run([str(tmp_path / "missing.json"), "--vary", "poll=100"], llama_tools)
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
    junk.write_text("{}")
    done = _run([str(junk), "--vary", "poll=100"], llama_tools)
    assert done.returncode == 2 and 'has no "config"' in done.stderr
