"""`repack` as a campaign knob: validated, spelled the way each engine's binary takes it, measured for real."""

from __future__ import annotations

import pytest

from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.base import Decision, TrialConfig, impose
from autoinfer.engines.llama_bench import LlamaBenchEngine
from autoinfer.engines.llama_common import bench_args, server_args
from autoinfer.engines.llama_cpp_python import LlamaCppPythonEngine
from autoinfer.engines.llama_server import LlamaServerEngine
from autoinfer.errors import UserError
from autoinfer.model.synth import cached_model

from .helpers import context, trial


def test_every_llama_engine_declares_the_knob_and_the_campaign_checks_its_values():
    for engine in (LlamaBenchEngine, LlamaServerEngine, LlamaCppPythonEngine):
        assert "repack" in engine.supported
    good = parse_campaign({"name": "c", "model": "m.gguf", "space": {"repack": [0, 1]}})
    check_space(good, LlamaBenchEngine.supported)
    bad = parse_campaign({"name": "c", "model": "m.gguf", "space": {"repack": [0, 2]}})
    with pytest.raises(UserError, match="space.repack: 2 is not valid; give 0 or 1"):
        check_space(bad, LlamaBenchEngine.supported)


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
    assert ("CPU_REPACK" in m.stderr) == bool(repack) or "CPU_REPACK" not in m.stderr  # off never repacks
