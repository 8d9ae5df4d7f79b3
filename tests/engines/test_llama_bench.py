"""The llama-bench engine on the real CPU build and tiny synthetic models; JSON fixtures for older/newer shapes."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
from pathlib import Path

import psutil
import pytest

from autoinfer.engines import llama_common
from autoinfer.engines.base import Outcome, create
from autoinfer.engines.llama_bench import measurement_from_json, parse_records
from autoinfer.engines.llama_common import (
    bench_args,
    bench_args_for,
    classify_failure,
    server_args,
    server_context,
)
from autoinfer.errors import UserError
from autoinfer.measure.process import run_isolated
from autoinfer.model.gguf_info import read_info
from autoinfer.model.placement import realize

from .helpers import context, trial

ENGINE = "llama-bench"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_bench"


# ------------------------------------------------------------------------------------------------ real runs


def test_real_run_gives_samples_raw_json_and_memory(engine, llama_tools, tiny_model, tmp_path):
    m = engine.run(trial(tiny_model), context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert len(m.pp_samples) == 2 and len(m.tg_samples) == 2
    assert all(v > 0 for v in m.pp_samples + m.tg_samples)
    records = json.loads(m.raw_output)
    pp = next(r for r in records if r["n_gen"] == 0)
    tg = next(r for r in records if r["n_prompt"] == 0)
    assert m.pp_samples == tuple(pp["samples_ts"]) and m.tg_samples == tuple(tg["samples_ts"])
    assert m.engine_s == pytest.approx((sum(pp["samples_ns"]) + sum(tg["samples_ns"])) / 1e9)
    assert 0 < m.engine_s < m.wall_s
    assert m.env["build_commit"] == pp["build_commit"]
    assert llama_tools.commit.startswith(m.env["build_commit"]) or m.env["build_commit"].startswith(
        llama_tools.commit)
    # The tree held the model (mapped) and the runtime: more than a few MiB, far less than a GiB.
    model_mib = tiny_model.stat().st_size / 2**20
    assert model_mib < m.rss_peak_mib < 1024
    assert m.vram_peak_mib is None  # no GPU index given
    assert m.metrics["load_mode"] == "mmap" and m.metrics["pp_tokens"] == 32 and m.metrics["tg_tokens"] == 8
    assert m.engine_cmd[0].endswith("llama-bench") and "-v" in m.engine_cmd


def test_batches_run_as_llama_cpp_caps_them_at_each_tests_context(engine, tiny_model, tmp_path):
    """llama.cpp caps a causal model's batch at the context and the ubatch at the batch (llama_context's
    constructor, logged with -v); llama-bench's pp test holds the prompt, its tg test the generation. `as_run` says
    the same, so a batch above the prompt is one run with the prompt's batch: measured once, predicted as it ran."""
    config = trial(tiny_model, repetitions=1, batch=256, ubatch=128)  # a 32-token prompt, 8 generated
    m = engine.run(config, context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    ran = engine.as_run(config)
    assert (ran.batch, ran.ubatch) == (32, 32) and engine.as_run(ran) == ran
    assert _logged(m.stderr, "n_batch") == [32, 8] and _logged(m.stderr, "n_ubatch") == [32, 8]
    again = engine.run(ran, context(tmp_path)).stderr  # what it names runs alike
    assert _logged(again, "n_batch") == [32, 8] and _logged(again, "n_ubatch") == [32, 8]
    small = trial(tiny_model, batch=16, ubatch=8)
    assert engine.as_run(small) == small  # within the context: as given


def _logged(stderr: str, name: str) -> list[int]:
    """The values llama_context logged for one of its parameters, one per context created (one per test)."""
    return [int(v) for v in re.findall(rf"llama_context: {name}\s+=\s+(\d+)", stderr)]


def test_model_path_with_spaces_survives(engine, tiny_model, tmp_path):
    spaced = tmp_path / "my models" / "tiny model; rm -rf x.gguf"
    spaced.parent.mkdir()
    shutil.copy(tiny_model, spaced)
    m = engine.run(trial(spaced, repetitions=1), context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert str(spaced) in m.engine_cmd
    assert json.loads(m.raw_output)[0]["model_filename"] == str(spaced)


def test_pp_only_and_bench_extras_reach_llama_bench(engine, tiny_model, tmp_path):
    cfg = trial(tiny_model, n_gen=0, repetitions=1,
                extra=(("cpu_mask", "0x1"), ("cpu_strict", True), ("poll", 10), ("prio", 0), ("delay", 0)))
    m = engine.run(cfg, context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert m.tg_samples == () and len(m.pp_samples) == 1
    (rec,) = json.loads(m.raw_output)
    assert (rec["cpu_mask"], rec["cpu_strict"], rec["poll"]) == ("0x1", True, 10)


def test_override_tensors_are_joined_with_semicolons(engine, tiny_model, tmp_path):
    patterns = (r"blk\.0\.ffn_.*_exps=CPU", r"blk\.1\.ffn_.*_exps=CPU")
    m = engine.run(trial(tiny_model, n_gen=0, repetitions=1, override_tensors=patterns), context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert m.engine_cmd[m.engine_cmd.index("-ot") + 1] == ";".join(patterns)
    assert json.loads(m.raw_output)[0]["tensor_buft_overrides"] == ";".join(patterns)


def test_a_partial_layer_placement_runs_in_llama_bench(engine, tiny_model, tmp_path):
    """placement/cpu_expert_layers/partial_experts as realize writes them: llama-fit-params' own partial pattern
    beside the whole layers' one, accepted by the real binary (a CPU build, which keeps every layer in RAM
    whatever -ngl says)."""
    n_layers = read_info(tiny_model).n_layers
    knobs = (("placement", "last"), ("cpu_expert_layers", 1), ("partial_experts", 2))
    config = realize(trial(tiny_model, n_gen=0, repetitions=1, n_gpu_layers=99, extra=knobs), n_layers)
    assert len(config.override_tensors) == 2 and rf"blk\.{n_layers - 2}\.ffn_(gate" in config.override_tensors[1]
    m = engine.run(config, context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert json.loads(m.raw_output)[0]["tensor_buft_overrides"] == ";".join(config.override_tensors)


def test_truncated_gguf_is_load_failed(engine, tiny_model, tmp_path):
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(tiny_model.read_bytes()[: tiny_model.stat().st_size // 2])
    m = engine.run(trial(broken), context(tmp_path))
    assert m.outcome is Outcome.LOAD_FAILED
    assert "error loading model" in m.reason and "file bounds" in m.reason


def test_bad_magic_is_load_failed(engine, tiny_model, tmp_path):
    broken = tmp_path / "magic.gguf"
    broken.write_bytes(b"XXXX" + tiny_model.read_bytes()[4:])
    m = engine.run(trial(broken), context(tmp_path))
    assert m.outcome is Outcome.LOAD_FAILED and "error loading model" in m.reason
    assert "invalid magic" in m.stderr


def test_quantized_v_cache_without_flash_attention_is_rejected(engine, tiny_model, tmp_path):
    m = engine.run(trial(tiny_model, type_v="q8_0", flash_attn="off"), context(tmp_path))
    assert m.outcome is Outcome.REJECTED
    assert "quantized V cache requires flash_attn" in m.reason


def test_unknown_cache_type_is_rejected(engine, tiny_model, tmp_path):
    m = engine.run(trial(tiny_model, type_k="q3_nonsense"), context(tmp_path))
    assert m.outcome is Outcome.REJECTED and m.reason == "error: invalid parameter for argument: -ctk"


def _processes_with(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(text in part for part in p.info["cmdline"] or []):
            found.append(p)
    return found


def test_timeout_kills_llama_bench(engine, tiny_model, tmp_path):
    unique = tmp_path / "timeout-victim.gguf"
    shutil.copy(tiny_model, unique)
    m = engine.run(trial(unique, n_prompt=0, n_gen=100000, repetitions=5), context(tmp_path, timeout_s=1.5))
    assert m.outcome is Outcome.TIMEOUT
    assert 1.5 <= m.wall_s < 10
    assert _processes_with(str(unique)) == []


def test_memory_limit_is_oom(llama_tools, tiny_model):
    """A real allocation failure: llama-bench under a 1 GiB address-space limit asked for a 4096-token batch."""
    cfg = trial(tiny_model, n_prompt=4096, n_gen=0, batch=4096, ubatch=4096, repetitions=1)
    limit = 1 << 30
    wrapper = [sys.executable, "-c",
               "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2); "
               "os.execv(sys.argv[2], sys.argv[2:])", str(limit)]
    res = run_isolated([*wrapper, str(llama_tools.tool("llama-bench")), "-v", *bench_args(cfg, llama_tools)],
                       timeout_s=120)
    assert res.returncode != 0
    outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr)
    assert outcome is Outcome.OOM, (reason, res.stderr[-2000:])
    assert "memory" in reason or "alloc" in reason


# --------------------------------------------------------------------------------------- failure verdicts


def test_signal_without_known_message_is_crash():
    res = run_isolated([sys.executable, "-c",
                        "import os, signal, sys; print('GGML_ASSERT(x) failed', file=sys.stderr, flush=True); "
                        "os.kill(os.getpid(), signal.SIGSEGV)"], timeout_s=30)
    assert res.signal == signal.SIGSEGV
    outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr)
    assert outcome is Outcome.CRASH and reason == "killed by SIGSEGV: GGML_ASSERT(x) failed"


def test_sigkill_near_the_ram_limit_is_oom_elsewhere_crash():
    assert classify_failure(-9, 9, False, "", rss_peak_mib=950, ram_limit_mib=1000)[0] is Outcome.OOM
    assert classify_failure(-9, 9, False, "", rss_peak_mib=100, ram_limit_mib=1000)[0] is Outcome.CRASH
    assert classify_failure(3, None, False, "x\nsomething odd\n") == (Outcome.CRASH, "exit status 3: something odd")


def test_cuda_oom_lines_from_the_source_are_oom():
    """Lines as ggml-cuda.cu and llama-model.cpp print them (no CUDA device here to provoke them)."""
    stderr = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: "
              "out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 9437184000\n"
              "llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
              "llama_bench: error: failed to load model 'm.gguf'\n")
    outcome, reason = classify_failure(1, None, False, stderr)
    assert outcome is Outcome.OOM and "cudaMalloc failed" in reason
    benign = "ggml_backend_cuda_host_malloc: failed to allocate 512.00 MiB of pinned memory: busy\n"
    assert classify_failure(1, None, False, benign + stderr.splitlines()[-1])[0] is Outcome.LOAD_FAILED


# ---------------------------------------------------------------------------------------- JSON parsing


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_current_json_fields():
    m = measurement_from_json(_fixture("current_0c1e570.json"), trial(Path("m.gguf")))
    assert m.outcome is Outcome.OK
    assert m.pp_samples == (40.1747, 39.6063) and m.tg_samples == (221.447, 776.276)
    assert m.engine_s == pytest.approx((796520460 + 807951724 + 36126040 + 10305609) / 1e9)
    assert m.metrics["load_mode"] == "auto" and m.env["build_commit"] == "0c1e570"
    assert "pp_samples_source" not in m.metrics


def test_jsonl_gives_the_same_measurement():
    cfg = trial(Path("m.gguf"))
    a = measurement_from_json(_fixture("current_0c1e570.json"), cfg)
    b = measurement_from_json(_fixture("current_0c1e570.jsonl"), cfg)
    assert (a.pp_samples, a.tg_samples, a.engine_s) == (b.pp_samples, b.tg_samples, b.engine_s)


def test_old_build_without_samples_falls_back_to_the_average_and_says_so():
    m = measurement_from_json(_fixture("old_use_mmap_no_samples.json"), trial(Path("m.gguf")))
    assert m.outcome is Outcome.OK
    assert m.pp_samples == (39.890532,) and len(m.tg_samples) == 1
    assert "avg_ts" in m.metrics["pp_samples_source"] and "avg_ts" in m.metrics["tg_samples_source"]
    assert m.metrics["load_mode"] == "mmap" and m.engine_s is None


def test_newer_fields_and_combined_test_are_ignored():
    m = measurement_from_json(_fixture("newer_extra_fields_and_pg.json"), trial(Path("m.gguf")))
    assert m.outcome is Outcome.OK
    assert m.pp_samples == (40.1747, 39.6063) and m.tg_samples == (221.447, 776.276)


def test_truncated_output_keeps_complete_records_and_is_bad_output_when_a_test_is_missing():
    text = _fixture("truncated_after_pp.json")
    assert [r["n_prompt"] for r in parse_records(text)] == [32]
    m = measurement_from_json(text, trial(Path("m.gguf")))
    assert m.outcome is Outcome.BAD_OUTPUT and "no tg record" in m.reason
    assert measurement_from_json(text, trial(Path("m.gguf"), n_gen=0)).outcome is Outcome.OK


def test_exit_zero_without_json_is_bad_output():
    m = measurement_from_json("| model | size |\n", trial(Path("m.gguf")))
    assert m.outcome is Outcome.BAD_OUTPUT and "no JSON records" in m.reason


# ------------------------------------------------------------------------------------------ flag builders


def test_bench_args_are_a_list_of_strings_with_json_output(llama_tools, tiny_model):
    cfg = trial(tiny_model, n_cpu_moe=3, load_mode="none", extra=(("cpu_strict", True), ("prio", 2)))
    argv = bench_args(cfg, llama_tools)
    assert all(isinstance(a, str) for a in argv)
    assert argv[-2:] == ["-o", "json"]
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["-m"] == str(tiny_model) and pairs["-ncmoe"] == "3" and pairs["-lm"] == "none"
    assert pairs["--cpu-strict"] == "1" and pairs["--prio"] == "2" and pairs["-t"] == "2"


@pytest.mark.parametrize("pattern", [r"blk\.[0-9]{1,2}\.ffn_.*=CPU", "a;b=CPU"])
def test_override_pattern_with_a_separator_is_refused(pattern):
    with pytest.raises(UserError, match="separator"):
        bench_args(trial(Path("m.gguf"), override_tensors=(pattern,)))


def test_cpu_mask_list_is_refused():
    with pytest.raises(UserError, match="one hex mask"):
        bench_args(trial(Path("m.gguf"), extra=(("cpu_mask", "0x1,0x2"),)))


def test_older_build_flags():
    """A build from before -ncmoe and -lm: defaults are left out, -mmp is used, other values are refused."""
    old = frozenset({"-m", "-p", "-n", "-r", "-t", "-b", "-ub", "-ctk", "-ctv", "-fa", "-ngl", "-mmp", "-o"})
    argv = bench_args_for(trial(Path("m.gguf"), load_mode="none"), old)
    assert "-ncmoe" not in argv and "-lm" not in argv
    assert argv[argv.index("-mmp") + 1] == "0"
    with pytest.raises(UserError, match="no -ncmoe flag"):
        bench_args_for(trial(Path("m.gguf"), n_cpu_moe=4), old)
    with pytest.raises(UserError, match="load_mode='mlock'"):
        bench_args_for(trial(Path("m.gguf"), load_mode="mlock"), old)


def test_server_args(llama_tools):
    cfg = trial(Path("/m/x.gguf"), override_tensors=("a=CPU", "b=CPU"), n_prompt=500, n_gen=20, load_mode="none")
    argv = server_args(cfg, llama_tools)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["-ot"] == "a=CPU,b=CPU" and pairs["-tb"] == "2" and pairs["-lm"] == "none"
    assert pairs["-c"] == "768" == str(server_context(cfg))
    assert "--port" not in argv and "--host" not in argv
    assert server_context(cfg.with_(extra=(("ctx_size", 4096),))) == 4096
    with pytest.raises(UserError, match="separator"):
        server_args(trial(Path("m.gguf"), override_tensors=("blk\\.{1,2}=CPU",)))


@pytest.mark.parametrize("name", ["llama-bench", "llama-server"])
def test_with_a_device_budget_the_engines_prefer_llama_cpps_own_thread_count(name, monkeypatch):
    """llama.cpp runs one thread per physical core unless told otherwise; without a device budget (a CPU host, where
    fewer threads measured faster on a loaded host) the engines prefer no thread count."""
    monkeypatch.setattr(llama_common, "usable_physical_cores", lambda: 24)
    engine = create(name)
    assert engine.preferred_values(True)["threads"] == 24
    assert "threads" not in engine.preferred_values(False)
