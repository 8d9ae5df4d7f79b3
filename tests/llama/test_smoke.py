"""A build is done when it runs: the smoke run, the repack-off decision and the rebuild without AMX.

The AMX crash of a VM is reproduced with a stand-in llama-bench (standin.py) in front of the real build: it dies
with SIGILL when quantized weights are repacked and otherwise runs the real binary.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from rich.console import Console
from standin import COMPONENT, faulted_pids, make_standin
from typer.testing import CliRunner

from autoinfer.campaign.spec import parse_campaign
from autoinfer.cli import app
from autoinfer.errors import UserError
from autoinfer.llama import smoke
from autoinfer.llama.binaries import ENV_VAR, user_tools
from autoinfer.llama.build import (
    BASE_FLAGS,
    build_key,
    checked,
    features_to_leave_out,
    variant_flags,
    working_tools,
)
from autoinfer.measure.crash import boot_seconds, kernel_component, kernel_log
from autoinfer.paths import default_storage
from autoinfer.store.trials import Store
from autoinfer.sweep.diagnosis import SWEEP_FAILED, diagnose
from autoinfer.sweep.runner import sweep

REPO = Path(__file__).resolve().parents[2]
#: /proc/cpuinfo flags of the Xeon VM where the crash was seen (the x86 part that matters here).
AMX_VM_FLAGS = frozenset(["sse4_2", "f16c", "fma", "bmi2", "avx", "avx2", "avx_vnni", "avx512f", "avx512cd",
                          "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile",
                          "amx_int8", "amx_bf16"])


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=400), out


def _flat(text: str) -> str:
    """A rich table's text with its borders and line wraps taken out."""
    return " ".join(re.sub(r"[│┃|─━┏┓┗┛┡┩└┘┌┐╇╈┼]", " ", text).split())


@pytest.fixture(scope="module")
def repack_standin(llama_tools, tmp_path_factory) -> Path:
    return make_standin(tmp_path_factory.mktemp("standin-repack"), llama_tools, "repack")


def _used_weight_types() -> set[str]:
    """Weight types the shipped campaigns and the tests hand to llama.cpp."""
    found: set[str] = set()
    for path in [*REPO.glob("experiments/*.yaml"), *REPO.glob("autoinfer/experiments/*.yaml")]:
        document = yaml.safe_load(path.read_text())
        if "contenders" in document:  # a contest: its campaigns are scanned as files of their own
            continue
        models = document["model"]
        for model in [models] if isinstance(models, str) else models:
            synth = re.fullmatch(r"synth:[\w-]+(?:/(\w+))?", model)
            named = re.search(r"-([A-Z0-9_]+)\.gguf$", model)
            found.add(synth.group(1) or "Q8_0" if synth else named.group(1) if named else "?")
    for path in REPO.glob("tests/**/*.py"):
        found.update(re.findall(r"cached_model\(\s*['\"][\w-]+['\"],\s*['\"](\w+)['\"]", path.read_text()))
    return found


def test_smoke_types_cover_every_weight_type_campaigns_and_tests_use():
    used = _used_weight_types()
    assert {"Q8_0", "Q4_K", "F16"} <= used  # the scan finds what is there
    assert used <= set(smoke.SMOKE_TYPES), f"add {sorted(used - set(smoke.SMOKE_TYPES))} to smoke.SMOKE_TYPES"


def test_the_real_build_passes_its_smoke_run(llama_tools):
    tools = working_tools()
    record = smoke.load(tools)
    assert record is not None and smoke.record_path(tools).parent == tools.bin_dir.parent  # beside build.json
    assert [r.qtype for r in record.runs if r.repack == 1] == list(smoke.SMOKE_TYPES)
    if record.verdict == "ok":  # hosts without the AMX crash
        assert all(r.ok for r in record.runs) and not tools.repack_off
    else:
        assert record.verdict == "repack_off" and tools.repack_off


def test_smoke_run_detects_the_crash_and_chooses_repack_off(repack_standin):
    console, out = _console()
    tools = checked(user_tools(repack_standin), console, smoke_again=True)
    record = smoke.load(tools)
    assert record is not None and record.verdict == "repack_off" and tools.repack_off
    by_type = {(r.qtype, r.repack): r for r in record.runs}
    assert by_type[("F16", 1)].ok and ("F16", 0) not in by_type  # float weights are never repacked
    crashed = by_type[("Q8_0", 1)]
    assert not crashed.ok and crashed.signal == "SIGILL" and "illegal instruction" in crashed.reason
    assert by_type[("Q8_0", 0)].ok and by_type[("Q4_K", 0)].ok
    printed = out.getvalue()
    assert "Q8_0 SIGILL → ok with --repack 0" in printed
    assert "decision: weight repacking crashes this build" in printed and str(smoke.record_path(tools)) in printed
    again_console, again = _console()
    assert checked(user_tools(repack_standin), again_console) == tools  # the record is reused, not re-run
    assert again.getvalue() == ""


def test_a_sweep_on_the_crashing_build_runs_every_trial_with_repack_off(repack_standin, monkeypatch, capsys):
    monkeypatch.setenv(ENV_VAR, str(repack_standin))
    campaign = parse_campaign({
        "name": "standin", "model": "synth:tiny", "space": {"n_gpu_layers": 0, "threads": 1, "ubatch": [32, 64]},
        "budget": {"trials": 2}, "measure": {"n_prompt": 64, "n_gen": 4, "repetitions": 2, "max_cv": None},
        "search": {"informed": False}, "confirm": {"enabled": False}, "drift": {"every": None},
        "idle": {"policy": "off"}, "sampler": {"name": "random", "seed": 0},
    })
    result = sweep(campaign, progress=False)
    trials = Store(result.study).records()
    assert len(trials) == 2 and all(t.outcome == "ok" for t in trials)
    for t in trials:
        assert t.config["repack"] == 0 and t.imposed_settings == {"repack": 0}
        cmd = t.engine_cmd
        assert cmd[cmd.index("--repack") + 1] == "0"
    [decision] = Store(result.study).study_record().imposed_settings
    assert decision.knob == "repack" and "weight repacking crashes" in decision.reason
    assert "decision: every trial runs with repack=0" in capsys.readouterr().err
    exported = CliRunner().invoke(app, ["export", "--study", "standin", "--format", "bench"])
    assert exported.exit_code == 0 and "--repack 0" in exported.output
    server = CliRunner().invoke(app, ["export", "--study", "standin", "--format", "server"])
    assert "--no-repack" in server.output or " -nr" in server.output
    status = _flat(CliRunner().invoke(app, ["status", "--study", "standin"]).output)
    assert "imposed on every trial repack=0: weight repacking crashes this build" in status
    asking = campaign.model_copy(update={"name": "asks", "space": {**campaign.space, "repack": [0, 1]}})
    with pytest.raises(UserError, match="space.repack: this machine's llama.cpp build needs repack=0"):
        sweep(asking, progress=False)


def test_user_binaries_that_crash_even_without_repack_get_the_rebuild_flags(llama_tools, tmp_path):
    tools = user_tools(make_standin(tmp_path / "always", llama_tools, "always"))
    console, out = _console()
    with pytest.raises(UserError, match="crashes on Q8_0 weights even with --repack 0") as caught:
        checked(tools, console)
    assert "SIGILL" in str(caught.value)
    record = smoke.load(tools)
    assert record.verdict == "broken" and "fail even with repack off" in record.decision
    assert "decision:" in out.getvalue()


def test_a_build_that_fails_without_a_crash_is_used_as_it_is_and_says_so(llama_tools, tmp_path):
    tools = user_tools(make_standin(tmp_path / "refuse", llama_tools, "refuse"))
    console, out = _console()
    assert checked(tools, console) == tools
    record = smoke.load(tools)
    assert record.verdict == "unverified" and "unknown model architecture" in record.decision
    assert "decision: the smoke run could not run Q8_0" in out.getvalue()


def test_fallback_build_flags_leave_out_amx_and_get_their_own_cache_key():
    flags = variant_flags(AMX_VM_FLAGS, ("amx",))
    assert flags[0] == "GGML_NATIVE=OFF"
    on = {f.split("=")[0] for f in flags if f.endswith("=ON")}
    assert {"GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_FMA"} <= on
    assert not on & {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"}
    assert "GGML_AMX_INT8=OFF" in flags  # explicit: ggml would otherwise pick its defaults
    no_avx512 = variant_flags(AMX_VM_FLAGS, ("amx", "avx512"))
    assert "GGML_AVX512=OFF" in no_avx512 and "GGML_AVX2=ON" in no_avx512
    assert "GGML_AVX512=OFF" in variant_flags(frozenset({"avx", "avx2", "fma", "f16c"}), ())  # absent: off
    default = build_key("0c1e570", "", list(BASE_FLAGS), "cpu")
    fallback = build_key("0c1e570", "", [*BASE_FLAGS, *flags], "cpu-noamx")
    assert default != fallback and fallback.startswith("0c1e570-cpu-noamx-")
    with pytest.raises(UserError, match="x86 CPU flags"):
        variant_flags(frozenset({"fp", "asimd"}), ("amx",))


def test_the_feature_left_out_follows_the_crash():
    def record(component: str) -> smoke.SmokeRecord:
        runs = (smoke.TypeRun("Q8_0", 1, False, "SIGILL", "SIGILL", component),
                smoke.TypeRun("Q8_0", 0, False, "SIGILL", "SIGILL", component))
        return smoke.SmokeRecord("b", "1-1", smoke.VERSION, runs, "broken", "", 0.0)

    assert features_to_leave_out(record("tinygemm_kernel_amx<block_q8_0> (libggml-cpu.so)")) == [
        ("amx",), ("amx", "avx512")]
    assert features_to_leave_out(record("_mm512_dpbusd_epi32 avx512 (libggml-cpu.so)")) == [("avx512",)]
    assert features_to_leave_out(record("")) == [("amx",), ("amx", "avx512")]


def test_a_campaign_whose_trials_all_crash_exits_3_with_a_diagnosis(llama_tools, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(make_standin(tmp_path / "trials", llama_tools, "trials")))
    path = tmp_path / "doomed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "doomed", "model": "synth:tiny", "space": {"n_gpu_layers": 0, "threads": 1, "ubatch": [32, 64]},
        "budget": {"trials": 2}, "measure": {"n_prompt": 64, "n_gen": 4, "repetitions": 2, "max_cv": None},
        "search": {"informed": False}, "confirm": {"enabled": False}, "drift": {"every": None},
        "idle": {"policy": "off"}, "sampler": {"name": "random", "seed": 0},
    }))
    runner = CliRunner()
    since = boot_seconds()
    swept = runner.invoke(app, ["sweep", str(path), "--quiet"])
    assert swept.exit_code == SWEEP_FAILED, swept.output
    assert "all 2 trials failed; most common: crash (SIGILL) in 2 of them" in swept.output
    assert "autoinfer build" in swept.output and "repack: 0" in swept.output
    study = optuna.load_study(study_name="doomed", storage=default_storage())
    # the kernel rate-limits its fault lines (and may not log them at all): a trial names the component when the
    # kernel logged every fault of the stand-in (a trial may run it more than once), and never names a wrong one
    logged = {int(re.search(r"llama-bench\[(\d+)\]", line).group(1)) for line in kernel_log()
              if kernel_component([line], "llama-bench", since)[1]}
    faulted = faulted_pids(tmp_path / "trials")
    for t in study.get_trials():
        assert t.user_attrs["metrics"]["signal"] == "SIGILL"
        assert "illegal instruction" in t.user_attrs["reason"]
        component = t.user_attrs["metrics"].get("faulting_component")
        if faulted and faulted <= logged:
            assert component == COMPONENT, (faulted, logged)
        if component is not None:
            assert component == COMPONENT
            assert f"in {COMPONENT} (from the kernel log)" in t.user_attrs["reason"]
    line = diagnose(study).line()
    exported = subprocess.run([sys.executable, "-c", "from autoinfer.cli import main; main()", "export", "--study",
                               "doomed"], check=False, capture_output=True, text=True, timeout=120)
    assert exported.returncode == 2 and line in exported.stderr and "Traceback" not in exported.stderr
    analysed = runner.invoke(app, ["analyze", "--study", "doomed", "--out", str(tmp_path / "report")])
    assert line in analysed.output
    assert f"recommended none: {_flat(line)}" in _flat(runner.invoke(app, ["status", "--study", "doomed"]).output)


def test_doctor_shows_the_smoke_run(repack_standin, monkeypatch):
    checked(user_tools(repack_standin), _console()[0])
    monkeypatch.setenv(ENV_VAR, str(repack_standin))
    shown = CliRunner().invoke(app, ["doctor"])
    assert shown.exit_code == 0, shown.output
    assert "smoke run" in shown.output and "repack_off" in shown.output
    assert "decision: weight repacking crashes this build" in shown.output
    assert json.loads(smoke.record_path(user_tools(repack_standin)).read_text())["verdict"] == "repack_off"
