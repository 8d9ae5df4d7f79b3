"""The `reference` engine plugin: one isolated worker per trial, failures as outcomes, and a real `autoinfer sweep`."""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autoinfer.engines import base
from autoinfer.engines.base import Outcome, RunContext, TrialConfig
from autoinfer.refengine.options import EngineOptions, flag


def run(config: TrialConfig, tmp_path: Path):
    return base.create("reference").run(config, RunContext(timeout_s=120, artifacts=tmp_path))


def test_measures_prompt_and_generation_with_expert_cache(hf_gguf, tmp_path):
    config = TrialConfig.from_params({"model": str(hf_gguf), "n_prompt": 32, "n_gen": 4, "repetitions": 2,
                                      "expert_slots": 5, "prefetch": True, "torch_threads": 1, "moe": "grouped"})
    m = run(config, tmp_path)
    assert m.outcome is Outcome.OK, m.reason + m.stderr[-2000:]
    assert len(m.pp_samples) == 2 and len(m.tg_samples) == 2 and min(m.pp_samples + m.tg_samples) > 0
    assert m.rss_peak_mib and m.rss_peak_mib > 0
    assert m.engine_cmd[1:3] == ("-m", "autoinfer.refengine.worker") and "--prefetch" in m.engine_cmd
    experts = m.metrics["experts"]
    assert experts["misses"] > 0 and experts["prefetched"] > 0 and 0 <= experts["hit_rate"] < 1
    assert m.metrics["expert_device_bytes"] == 5 * 3 * 64 * 32 * 4  # five fp32 slots of 3 × hidden × ffn



def test_the_worker_reports_misses_computed_on_the_host(hf_gguf, tmp_path):
    config = TrialConfig.from_params({"model": str(hf_gguf), "n_prompt": 16, "n_gen": 4, "repetitions": 1,
                                      "expert_slots": 5, "misses": "cpu", "torch_threads": 1})
    m = run(config, tmp_path)
    assert m.outcome is Outcome.OK, m.reason + m.stderr[-2000:]
    assert m.engine_cmd[m.engine_cmd.index("--misses") + 1] == "cpu"
    experts = m.metrics["experts"]
    assert experts["cpu_computed"] > 0 and experts["cpu_decoded"] == 0  # F32 experts: nothing to decode
    assert experts["bytes_fetched"] == (experts["misses"] - experts["cpu_computed"]) * 3 * 64 * 32 * 4

@pytest.mark.parametrize("params,outcome,words", [
    ({"device": "cuda"}, Outcome.REJECTED, "cuda"),
    ({"gdn": "fancy"}, Outcome.REJECTED, "gdn variant"),
    ({"dtype": "fp8"}, Outcome.REJECTED, "dtype"),
])
def test_bad_knobs_are_rejected_outcomes(hf_gguf, tmp_path, params, outcome, words):
    import torch

    if params.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    m = run(TrialConfig.from_params({"model": str(hf_gguf), "n_prompt": 8, "n_gen": 2, **params}), tmp_path)
    assert m.outcome is outcome and words in m.reason


def test_a_file_that_is_not_gguf_is_a_load_failure(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model")
    m = run(TrialConfig(model=bad, n_prompt=8, n_gen=2), tmp_path)
    assert m.outcome is Outcome.LOAD_FAILED and "bad magic" in m.reason


CAMPAIGN = """\
name: ref-sweep
engine: reference
model: {model}
space:
  gdn: [naive, chunk]
  moe: [loop, grouped]
  expert_slots: [0, 6]
  torch_threads: 1
objective: tg
budget: {{trials: 3}}
measure: {{n_prompt: 16, n_gen: 4, repetitions: 2, timeout_s: 120, max_cv: null}}
search: {{informed: false, fit_params: false}}
confirm: {{enabled: false}}
drift: {{every: null}}
idle: {{policy: "off"}}
sampler: {{name: random, seed: 0}}
"""


@pytest.mark.slow
def test_sweep_campaign_with_the_reference_engine(hf_gguf, tmp_path):
    import optuna

    campaign = tmp_path / "ref.yaml"
    campaign.write_text(CAMPAIGN.format(model=hf_gguf))
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-c", "from autoinfer.cli import main; main()", "sweep", str(campaign),
                           "--quiet"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "AUTOINFER_RESULTS": str(results)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="ref-sweep", storage=f"sqlite:///{results / 'autoinfer.db'}")
    trials = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    assert len(trials) == 3
    for t in trials:
        assert set(t.params) == {"gdn", "moe", "expert_slots"}
        assert t.user_attrs["config"]["torch_threads"] == 1
        assert len(t.user_attrs["tg_samples"]) == 2
        assert t.value == pytest.approx(statistics.median(t.user_attrs["tg_samples"]))  # objective: tg
        assert "autoinfer.refengine.worker" in t.user_attrs["engine_cmd"]
    assert "llama-server" not in proc.stdout and "gdn:" in proc.stdout  # its own settings, not a llama.cpp command
    said = " ".join(proc.stdout.split())
    # the printed generate command, run once as the deployment check: the measurement's 16-token prompt, 8 tokens
    assert "generate text with it: " in said and "deployment check passed: generate answered to a 16-token prompt " \
        "with 8 tokens" in said, proc.stdout[-2000:]
    cli = [sys.executable, "-c", "from autoinfer.cli import main; main()", "export", "--study", "ref-sweep"]
    env = {**os.environ, "AUTOINFER_RESULTS": str(results)}
    refused = subprocess.run([*cli, "--format", "server"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "use --format bench (its own command), json or yaml" in refused.stderr
    exported = subprocess.run([*cli, "--format", "yaml"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert exported.returncode == 0 and "llama_server" not in exported.stdout and "autoinfer.refengine.worker" in \
        exported.stdout
    generate = subprocess.run([*cli, "--format", "generate"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert generate.returncode == 0 and "-m autoinfer.refengine.generate --model" in generate.stdout
    pasted = subprocess.run(shlex.split(generate.stdout.strip()) + ["--n-predict", "3"], capture_output=True,
                            text=True, cwd=tmp_path, env=env)
    assert pasted.returncode == 0 and "generated: 3 tokens" in pasted.stderr, pasted.stderr
    command = subprocess.run([*cli, "--format", "bench"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert command.returncode == 0 and "-m autoinfer.refengine.worker --model" in command.stdout
    # the searched knobs as a measured trial ran them (a knob at the worker's default has no flag)
    argv = shlex.split(command.stdout.strip())
    defaults = EngineOptions()
    ran = {k: argv[argv.index(flag(k)) + 1] if flag(k) in argv else str(getattr(defaults, k))
           for k in ("gdn", "moe", "expert_slots")}
    assert ran in [{k: str(v) for k, v in t.params.items()} for t in trials], command.stdout
