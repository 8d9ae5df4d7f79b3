"""The environment stored with every trial, the idle check before it, and llama-bench's priority and thread
placement knobs as campaign parameters — on the real llama-bench and a tiny synthetic model."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.base import create
from autoinfer.errors import UserError
from autoinfer.measure import idle
from autoinfer.measure.environment import model_fingerprint
from autoinfer.sweep import runner

# ------------------------------------------------------------------------------------------------ model hash


def test_model_fingerprint_tells_files_apart(tmp_path, tiny_model):
    copy = tmp_path / "copy of model.gguf"
    shutil.copyfile(tiny_model, copy)
    a, b = model_fingerprint(tiny_model), model_fingerprint(copy)
    assert a["bytes"] == b["bytes"] == tiny_model.stat().st_size
    assert a["hash"] == b["hash"] and len(a["hash"]) == 32
    with open(copy, "r+b") as fh:  # change the last byte: the last sampled chunk covers the end of the file
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    assert model_fingerprint(copy)["hash"] != a["hash"]


# ------------------------------------------------------------------------------------------------ idle check


@pytest.fixture
def busy_loop():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def test_idle_check_sees_a_busy_process_and_subtracts_its_own(busy_loop):
    """Other work shares this machine, so only presence is asserted, not how much CPU the loop got."""
    seen = idle.check(cpu_busy=99.9, interval_s=1.0)
    assert isinstance(seen.cpu_percent, float) and isinstance(seen.gpu_processes, tuple)
    assert seen.own_cpu_percent < 5  # only the harness itself, which sleeps while it watches
    assert all(isinstance(pid, int) and isinstance(name, str) and pct > 0 for pid, name, pct in seen.cpu_top)
    own = idle.check(cpu_busy=99.9, interval_s=1.0, exclude={busy_loop.pid})
    assert own.own_cpu_percent > seen.own_cpu_percent + 1  # the loop's share, on the whole-machine scale
    assert busy_loop.pid not in [pid for pid, _, _ in own.cpu_top]


def test_idle_policies(busy_loop):
    assert idle.guard("off", cpu_busy=10, wait_s=0) == {"policy": "off"}
    warned = idle.guard("warn", cpu_busy=1, wait_s=0)
    assert warned["busy"] and warned["busy_reasons"] and warned["waited_s"] < 5
    waited = idle.guard("wait", cpu_busy=1, wait_s=1.0, poll_s=0.2)
    assert waited["busy"] and waited["waited_s"] >= 1.0  # waited the full time, then measured anyway
    with pytest.raises(UserError, match="not idle"):
        idle.guard("refuse", cpu_busy=1, wait_s=0)
    with pytest.raises(UserError, match="idle.policy"):
        idle.guard("sleep", cpu_busy=1, wait_s=0)


# ------------------------------------------------------------------------------------------------ real trials


def _campaign(llama_tools, tiny_model, space, **keys):
    return parse_campaign({
        "name": "env-e2e",
        "engine_options": {"llama_bin": str(llama_tools.bin_dir)},
        "model": str(tiny_model),
        "space": {"n_gpu_layers": 0, "threads": 2, **space},
        "budget": {"trials": 1},
        "measure": {"n_prompt": 16, "n_gen": 8, "repetitions": 3, "timeout_s": 120, "max_cv": None},
        "drift": {"every": None},
        "confirm": {"enabled": False},
        **keys,
    })


@pytest.mark.slow
def test_trial_environment_fields_are_present_and_typed(llama_tools, tiny_model):
    study = runner.sweep(_campaign(llama_tools, tiny_model, {}, idle={"policy": "warn"}), progress=False).study
    t = study.trials[0]
    assert t.user_attrs["outcome"] == "ok"
    env = t.user_attrs["env"]
    assert isinstance(env["started_at"], float) and env["duration_s"] > 0
    host = env["host"]
    assert isinstance(host["cpu_model"], str) and host["cpu_model"]
    assert isinstance(host["logical_cores"], int) and host["logical_cores"] >= 1
    assert host["ram_total_mib"] > 0
    assert env["build"]["commit"] == llama_tools.commit and env["build"]["cuda"] is llama_tools.cuda
    assert isinstance(env["build"]["flags"], list)
    assert env["model"]["bytes"] == tiny_model.stat().st_size and len(env["model"]["hash"]) == 32
    assert isinstance(env["autoinfer"], str) and env["autoinfer"]
    assert env["tokens"] == 3 * 16 + 3 * 8
    if env["gpu"] is not None:  # on a machine with an NVIDIA driver
        assert {"name", "driver", "cuda", "start", "end", "energy_j", "tokens_per_joule"} <= set(env["gpu"])
        assert isinstance(env["gpu"]["start"]["sm_clock_mhz"], int)
    idle_seen = t.user_attrs["idle"]
    assert idle_seen["policy"] == "warn" and isinstance(idle_seen["busy"], bool)
    stats = t.user_attrs["stats"]
    for kind in ("tg", "pp"):
        assert stats[kind]["n"] == 3 and stats[kind]["ci"][0] <= stats[kind]["median"] <= stats[kind]["ci"][1]
        assert stats[kind]["cv"] >= 0


@pytest.mark.slow
def test_priority_and_thread_placement_reach_llama_bench(llama_tools, tiny_model):
    space = {"prio": 1, "cpu_mask": "0x3", "cpu_strict": True, "delay": 0, "poll": [0, 100]}
    study = runner.sweep(_campaign(llama_tools, tiny_model, space, idle={"policy": "off"}), progress=False).study
    t = study.trials[0]
    assert t.user_attrs["outcome"] == "ok", t.user_attrs["reason"]
    cmd = t.user_attrs["engine_cmd"]
    for flag, value in (("--prio", "1"), ("-C", "0x3"), ("--cpu-strict", "1"), ("--poll", str(t.params["poll"]))):
        assert cmd[cmd.index(flag) + 1] == value


@pytest.mark.parametrize("name,value,message", [
    ("prio", 4, "-1 .low. to 3"),
    ("cpu_mask", 3, "quoted hex"),
    ("cpu_mask", "0xZZ", "quoted hex"),
    ("cpu_strict", 2, "0, 1"),
    ("delay", -1, "0 or more"),
    ("poll", [50, 101], "0 to 100"),
])
def test_bad_thread_knob_is_refused_before_any_trial(llama_tools, tiny_model, name, value, message):
    campaign = _campaign(llama_tools, tiny_model, {name: value})
    engine = create("llama-bench", llama_bin=llama_tools.bin_dir)
    with pytest.raises(UserError, match=rf"space\.{name}: .*{message}"):
        check_space(campaign, engine.knobs)
