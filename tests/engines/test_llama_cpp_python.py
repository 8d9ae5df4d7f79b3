"""The llama-cpp-python engine on the shared libllama of the CPU build, validation of knobs it lacks, and the
cross-check of the three llama.cpp engines on one configuration."""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path

import psutil
import pytest

from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.base import Outcome, create
from autoinfer.engines.llama_cpp_python import llama_kwargs
from autoinfer.errors import UserError

from .helpers import context, trial

ENGINE = "llama-cpp-python"

_cfg = partial(trial, flash_attn="off")


def test_measures_through_the_builds_libllama(engine, llama_tools, chat_model, tmp_path):
    m = engine.run(_cfg(chat_model, type_k="q8_0"), context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert len(m.tg_samples) == 2 and len(m.pp_samples) == 2 and all(v > 0 for v in m.tg_samples + m.pp_samples)
    assert Path(m.env["library_loaded"]).resolve() == (llama_tools.lib_dir / "libllama.so").resolve()
    assert m.metrics["load_s"] > 0 and m.engine_s and m.engine_s > 0
    assert m.rss_peak_mib and m.rss_peak_mib > 10
    assert not [p for p in psutil.Process().children(recursive=True)]


def test_load_failure_is_an_outcome(engine, tmp_path):
    bogus = tmp_path / "not a model.gguf"
    bogus.write_bytes(b"GGUF" + b"\0" * 64)
    m = engine.run(_cfg(bogus), context(tmp_path))
    assert m.outcome is Outcome.LOAD_FAILED, (m.outcome, m.reason)


def test_kwargs_are_what_llama_takes(tmp_path):
    kw = llama_kwargs(_cfg(tmp_path / "m.gguf", type_v="q4_0", load_mode="mmap+mlock", flash_attn="on",
                           extra=(("op_offload", False), ("threads_batch", 1))))
    assert kw["type_v"] == 2 and kw["type_k"] == 1  # ggml_type enum values
    assert (kw["use_mmap"], kw["use_mlock"], kw["flash_attn"], kw["op_offload"]) == (True, True, True, False)
    assert (kw["n_threads"], kw["n_threads_batch"], kw["n_ctx"]) == (2, 1, 256)
    with pytest.raises(UserError, match="n_cpu_moe or tensor overrides"):
        llama_kwargs(_cfg(tmp_path / "m.gguf", n_cpu_moe=2))
    with pytest.raises(UserError, match="load_mode 'dio'"):
        llama_kwargs(_cfg(tmp_path / "m.gguf", load_mode="dio"))


@pytest.mark.parametrize("knob, value", [("n_cpu_moe", [0, 4]), ("override_tensors", "blk\\.0\\.ffn_.*_exps=CPU")])
def test_campaign_asking_for_expert_placement_fails_validation(knob, value):
    campaign = parse_campaign({"name": "c", "engine": "llama-cpp-python", "model": "m.gguf", "space": {knob: value}})
    engine_cls = type(create("llama-cpp-python"))
    with pytest.raises(UserError) as err:
        check_space(campaign, engine_cls.knobs)
    message = str(err.value)
    assert f"space.{knob}" in message and "'llama-cpp-python' has no parameter" in message
    assert "llama-bench" in message and "llama-server" in message  # where the knob exists


def test_three_engines_agree_on_one_configuration(engine, llama_tools, chat_model, tmp_path):
    """Same build, model and configuration: the medians agree within the noise of a shared 2-core machine.
    A unit or token-count mistake in one engine (ms for s, tokens per request summed twice) is far outside it."""
    # one thread: two spinning threads on two shared, busy cores measure the contention, not the engine
    config = _cfg(chat_model, n_prompt=64, n_gen=16, repetitions=5, threads=1)
    medians = {}
    for name in ("llama-bench", "llama-server", "llama-cpp-python"):
        e = engine if name == "llama-cpp-python" else create(name, llama_bin=llama_tools.bin_dir)
        m = e.run(config, context(tmp_path, 300))
        assert m.outcome is Outcome.OK, (name, m.reason)
        medians[name] = (statistics.median(m.pp_samples), statistics.median(m.tg_samples))
    for kind, index in (("pp", 0), ("tg", 1)):
        values = [v[index] for v in medians.values()]
        assert max(values) / min(values) < 3.0, (kind, medians)
