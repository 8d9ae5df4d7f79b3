"""`repack` as a campaign knob: validated, spelled the way each engine's binary takes it, measured for real."""

from __future__ import annotations

import subprocess
import sys

import pytest
from optuna.trial import TrialState

from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.base import Decision, TrialConfig, create, impose
from autoinfer.engines.llama_bench import LlamaBenchEngine
from autoinfer.engines.llama_common import bench_args, server_args
from autoinfer.engines.llama_cpp_python import LlamaCppPythonEngine
from autoinfer.engines.llama_server import LlamaServerEngine
from autoinfer.errors import UserError
from autoinfer.export.formats import render
from autoinfer.model.synth import cached_model
from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import Best

from .helpers import context, trial


def test_every_llama_engine_declares_the_knob_and_the_campaign_checks_its_values():
    for engine in (LlamaBenchEngine, LlamaServerEngine, LlamaCppPythonEngine):
        assert "repack" in engine.knobs
    good = parse_campaign({"name": "c", "model": "m.gguf", "space": {"repack": [0, 1]}})
    check_space(good, LlamaBenchEngine.knobs)
    bad = parse_campaign({"name": "c", "model": "m.gguf", "space": {"repack": [0, 2]}})
    with pytest.raises(UserError, match="space.repack: 2 is not valid; give 0 or 1"):
        check_space(bad, LlamaBenchEngine.knobs)


def test_the_binaries_get_the_flag_their_help_lists(llama_tools, tiny_model):
    off = TrialConfig(tiny_model, extra=(("repack", 0),))
    bench = bench_args(off, llama_tools)
    assert bench[bench.index("--repack") + 1] == "0"
    server = server_args(off, llama_tools)
    assert "--no-repack" in server or "-nr" in server
    on = TrialConfig(tiny_model, extra=(("repack", True),))
    assert bench_args(on, llama_tools)[bench_args(on, llama_tools).index("--repack") + 1] == "1"
    assert not {"--no-repack", "-nr"} & set(server_args(on, llama_tools))
    assert "--repack" not in bench_args(TrialConfig(tiny_model), llama_tools)  # unset: llama.cpp's default


def test_an_imposed_setting_replaces_the_configuration_value(tiny_model):
    config = TrialConfig(tiny_model, extra=(("prio", 1),))
    imposed = impose(config, (Decision("repack", 0, "smoke run"),))
    assert imposed.get("repack") == 0 and imposed.get("prio") == 1
    assert impose(config, ()) is config


@pytest.mark.parametrize("repack", [0, 1])
def test_llama_bench_runs_with_repack_on_and_off(llama_tools, repack, tmp_path):
    model = cached_model("tiny", "Q4_0")  # a type ggml-cpu repacks on x86
    engine = LlamaBenchEngine(llama_bin=llama_tools.bin_dir)
    m = engine.run(trial(model, n_prompt=8, n_gen=4, repetitions=1, extra=(("repack", repack),)), context(tmp_path))
    assert m.ok, m.reason
    assert m.engine_cmd[m.engine_cmd.index("--repack") + 1] == str(repack)
    # llama.cpp -v names the repacked buffer ggml-cpu puts Q4_0 weights in (AVX2 and NEON have that path)
    assert ("CPU_REPACK model buffer size" in m.stderr) == bool(repack)


CHILD = """\
import sys
namespace = {}
exec(compile(sys.argv[1], "exported.py", "exec"), namespace)
print(namespace["llm"].model_params.use_extra_bufts)
"""


@pytest.mark.parametrize("repack, expected", [(0, "False"), (None, "True")])
def test_the_python_export_turns_repack_off_as_measured(llama_tools, tiny_model, repack, expected):
    extra = () if repack is None else (("repack", repack),)
    config = TrialConfig(tiny_model, flash_attn="on", n_gpu_layers=0, extra=extra)
    best = Best(TrialRecord(0, TrialState.COMPLETE, values=(1.0,), config=config.to_params()), config, 1.0)
    snippet = render("python", best, "s", "llama-cpp-python")
    env = create("llama-cpp-python", llama_bin=llama_tools.bin_dir).child_env()
    child = subprocess.run([sys.executable, "-c", CHILD, snippet], check=False, capture_output=True, text=True,
                           env=env, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().splitlines()[-1] == expected
