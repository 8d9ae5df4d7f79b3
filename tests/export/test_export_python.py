"""`autoinfer export --format python`: a llama-cpp-python snippet from a real finished sweep, run with the binding
on the build's libllama; knobs Llama() cannot express fail the export instead of vanishing."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autoinfer.cli import app
from autoinfer.engines.base import TrialConfig, create
from autoinfer.engines.llama_cpp_python import llama_kwargs
from autoinfer.errors import UserError
from autoinfer.export.formats import render
from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import Best, load_study
from autoinfer.sweep.recommend import as_best, recommend

CAMPAIGN = """\
name: py-export
engine: llama-bench
model: "{model}"
space:
  n_gpu_layers: 0
  threads: 1
  batch: [64, 128]
  ubatch: [32, 64]
  type_k: [f16, q8_0]
  flash_attn: "on"
  load_mode: [mmap, none]
budget: {{trials: 3}}
measure: {{n_prompt: 128, n_gen: 4, repetitions: 1, timeout_s: 120, max_cv: null}}
search: {{informed: false}}
confirm: {{enabled: false}}
drift: {{every: null}}
idle: {{policy: "off"}}
sampler: {{name: random, seed: 3}}
"""

# Builds Llama from the exported snippet, then reports keywords Llama() would swallow through **kwargs and the
# parameters it actually set.
CHILD = """\
import inspect, json, sys
from llama_cpp import Llama
namespace = {}
exec(compile(sys.argv[1], "exported.py", "exec"), namespace)
llm, names = namespace["llm"], json.loads(sys.argv[2])
cp, mp = llm.context_params, llm.model_params
print(json.dumps({"unknown": sorted(set(names) - set(inspect.signature(Llama.__init__).parameters)),
                  "n_ctx": llm.n_ctx(), "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch, "n_threads": cp.n_threads,
                  "type_k": cp.type_k, "type_v": cp.type_v, "flash_attn": cp.flash_attn_type,
                  "load_mode": mp.load_mode, "n_gpu_layers": mp.n_gpu_layers}))
"""


def llama_call(snippet: str) -> dict:
    """The keyword arguments of the snippet's `Llama(...)` call, read back as Python values."""
    calls = [n for n in ast.walk(ast.parse(snippet)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Llama"]
    assert len(calls) == 1 and not calls[0].args
    return {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}


@pytest.fixture(scope="module")
def chat_model() -> Path:
    from autoinfer.model.synth import cached_model

    return cached_model("tiny", "Q8_0", tokenizer="qwen35")


def test_exported_snippet_builds_the_measured_configuration(tmp_path, llama_tools, chat_model, monkeypatch):
    monkeypatch.setenv("AUTOINFER_LLAMA_BIN", str(llama_tools.bin_dir))
    path = tmp_path / "py-export.yaml"
    path.write_text(CAMPAIGN.format(model=chat_model))
    runner = CliRunner()
    done = runner.invoke(app, ["sweep", str(path), "--quiet"])
    assert done.exit_code == 0, done.output
    exported = runner.invoke(app, ["export", "--study", "py-export", "--format", "python"])
    assert exported.exit_code == 0, exported.output
    snippet = exported.output
    compile(snippet, "exported.py", "exec")
    study = load_study("py-export", None)
    best = as_best(study, recommend(study))
    kwargs = llama_call(snippet)
    assert kwargs == llama_kwargs(best.config)  # the engine's own mapping, nothing added or lost
    assert kwargs["model_path"] == str(chat_model) and kwargs["flash_attn"] is True and kwargs["n_threads"] == 1

    env = create("llama-cpp-python", llama_bin=llama_tools.bin_dir).child_env()
    child = subprocess.run([sys.executable, "-c", CHILD, snippet, json.dumps(list(kwargs))], check=False,
                           capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    built = json.loads(child.stdout.strip().splitlines()[-1])
    config = best.config
    assert built["unknown"] == []  # Llama() would drop these silently
    assert (built["n_batch"], built["n_ubatch"], built["n_threads"]) == (config.batch, config.ubatch, 1)
    assert (built["type_k"], built["type_v"]) == ({"f16": 1, "q8_0": 8}[config.type_k], 1)  # ggml_type ids
    assert built["flash_attn"] == 1 and built["load_mode"] == {"none": 0, "mmap": 1}[config.load_mode]
    assert built["n_gpu_layers"] == 0 and built["n_ctx"] == kwargs["n_ctx"]


def best_of(engine_config: TrialConfig) -> Best:
    trial = TrialRecord(0, TrialState.COMPLETE, values=(10.0,), config=engine_config.to_params())
    return Best(trial, engine_config, 10.0)


@pytest.mark.parametrize("changes, engine, named", [
    ({"n_cpu_moe": 2}, "llama-bench", "n_cpu_moe=2"),
    ({"override_tensors": ("blk\\.0\\.ffn_.*_exps=CPU",)}, "llama-server", "override_tensors="),
    ({"extra": (("poll", 0),)}, "llama-bench", "poll=0"),
    ({"extra": (("parallel", 4),)}, "llama-server", "parallel=4"),
    ({"flash_attn": "auto"}, "llama-bench", "flash_attn='auto'"),
    ({"load_mode": "dio"}, "llama-bench", "load_mode 'dio'"),
])
def test_knobs_llama_cannot_express_fail_the_export(tmp_path, changes, engine, named):
    best = best_of(TrialConfig(tmp_path / "m.gguf", **{"flash_attn": "on", **changes}))
    with pytest.raises(UserError) as err:
        render("python", best, "s", engine)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_what_the_python_engine_measured_exports_as_it_ran(tmp_path):
    config = TrialConfig(tmp_path / "m.gguf", flash_attn="auto", threads=4,
                         extra=(("threads_batch", 2), ("offload_kqv", False), ("ctx_size", 1024)))
    kwargs = llama_call(render("python", best_of(config), "s", "llama-cpp-python"))
    assert kwargs["flash_attn"] is False  # the engine ran "auto" as Llama()'s default, off
    assert (kwargs["n_threads"], kwargs["n_threads_batch"], kwargs["offload_kqv"], kwargs["n_ctx"]) == (4, 2, False, 1024)
    with pytest.raises(UserError, match="json or yaml"):
        render("python", best_of(config), "s", "reference")
