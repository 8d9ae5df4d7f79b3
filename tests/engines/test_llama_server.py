"""The llama-server engine on the real CPU build and a tiny synthetic model with a real tokenizer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from autoinfer.engines.base import Outcome
from autoinfer.engines.llama_server import free_port

from .helpers import context, trial

ENGINE = "llama-server"


def _servers(root: psutil.Process) -> list[psutil.Process]:
    return [p for p in root.children(recursive=True) if p.name() == "llama-server"]


def _port_free(port: int) -> bool:
    """Nothing listens there: a new server (SO_REUSEADDR, as llama-server binds) could take the port. Closed
    connections may still sit in TIME_WAIT; that is TCP, not a leftover process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_healthy(root: psutil.Process, deadline_s: float = 60) -> tuple[psutil.Process, int]:
    """The server below `root` once /health answers 200, and its port."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for proc in _servers(root):
            try:
                argv = proc.cmdline()
            except psutil.Error:
                continue
            if "--port" not in argv:  # between fork and exec
                continue
            port = int(argv[argv.index("--port") + 1])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, port
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError("llama-server never became healthy")


def _wait_generating(port: int, deadline_s: float = 60) -> None:
    """Until a slot generates a request after the warm-up (task 0): the measured one, which a fast host finishes
    within a second or two (the server caps it at the context size)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=2) as r:
                if any(s.get("is_processing") and s.get("id_task", 0) >= 1 for s in json.load(r)):
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError("llama-server never started the measured request")


def test_measures_prompt_and_generation_with_startup_and_ttft(engine, chat_model, tmp_path):
    m = engine.run(trial(chat_model), context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert len(m.tg_samples) == 2 and len(m.pp_samples) == 2
    assert all(v > 0 for v in m.tg_samples + m.pp_samples)
    assert m.metrics["prompt_tokens"] == [32, 32]  # exactly n_prompt tokens were processed, nothing cached
    assert 0 < m.metrics["startup_s"] < 60
    assert len(m.metrics["ttft_ms"]) == 2 and all(t > 0 for t in m.metrics["ttft_ms"])
    rounds = json.loads(m.raw_output)
    assert [r["requests"][0]["predicted_n"] for r in rounds] == [8, 8]  # ignore_eos: every token generated
    assert rounds[0]["requests"][0]["cache_n"] == 0
    assert m.rss_peak_mib and m.rss_peak_mib > 10
    assert "--port" in m.engine_cmd and m.env["tools_commit"]
    assert not _servers(psutil.Process())  # stopped at the end of the trial
    assert _port_free(m.env["port"])


def test_parallel_slots_sum_concurrent_requests(engine, chat_model, tmp_path):
    config = trial(chat_model, repetitions=1, batch=2048, ubatch=1024, extra=(("parallel", 2),))
    m = engine.run(config, context(tmp_path))
    assert m.outcome is Outcome.OK, m.reason
    assert "-np" in m.engine_cmd and m.engine_cmd[m.engine_cmd.index("-np") + 1] == "2"
    # one slot needs 256 tokens of context (32 + 8 rounded up); two slots get twice that
    assert m.engine_cmd[m.engine_cmd.index("-c") + 1] == "512"
    # llama.cpp caps the batch at the whole context (every slot's) and the ubatch at the batch
    ran = engine.as_run(config)
    assert (ran.batch, ran.ubatch) == (512, 512)
    requests = json.loads(m.raw_output)[0]["requests"]
    assert len(requests) == 2
    assert m.tg_samples[0] == pytest.approx(sum(r["predicted_per_second"] for r in requests))
    assert m.metrics["prompt_tokens"] == [32, 32]


def test_load_failure_is_an_outcome(engine, tmp_path):
    bogus = tmp_path / "not a model.gguf"  # a space in the path must survive too
    bogus.write_bytes(b"GGUF" + b"\0" * 64)
    m = engine.run(trial(bogus), context(tmp_path))
    assert m.outcome is Outcome.LOAD_FAILED, (m.outcome, m.reason)
    assert not _servers(psutil.Process())


def test_timeout_kills_the_server(engine, chat_model, tmp_path):
    # the server caps generation at the model's 4096-token context: 2-5 s on a 2-core machine, so 1 s runs out
    m = engine.run(trial(chat_model, n_gen=100000, repetitions=1, threads=1), context(tmp_path, timeout_s=1))
    assert m.outcome is Outcome.TIMEOUT, (m.outcome, m.reason)
    assert not _servers(psutil.Process())
    assert _port_free(m.env["port"])


def test_server_killed_mid_trial_is_a_crash_without_orphans(engine, chat_model, tmp_path):
    result = {}
    config = trial(chat_model, n_gen=100000, repetitions=1)
    worker = threading.Thread(target=lambda: result.setdefault("m", engine.run(config, context(tmp_path, 300))))
    worker.start()
    server, port = _wait_healthy(psutil.Process())
    _wait_generating(port)
    server.send_signal(signal.SIGKILL)
    worker.join(60)
    assert not worker.is_alive()
    m = result["m"]
    assert m.outcome is Outcome.CRASH and "SIGKILL" in m.reason, (m.outcome, m.reason)
    assert not psutil.pid_exists(server.pid)
    assert not _servers(psutil.Process())
    assert _port_free(port)


def test_harness_killed_mid_trial_takes_the_server_with_it(llama_tools, chat_model, tmp_path):
    script = (
        "import sys\nfrom pathlib import Path\n"
        "from autoinfer.engines.base import RunContext, TrialConfig, create\n"
        "e = create('llama-server', llama_bin=sys.argv[1])\n"
        "c = TrialConfig(Path(sys.argv[2]), n_prompt=32, n_gen=100000, repetitions=1, threads=2, n_gpu_layers=0)\n"
        "e.run(c, RunContext(timeout_s=300, artifacts=Path(sys.argv[3])))\n"
    )
    harness = subprocess.Popen([sys.executable, "-c", script, str(llama_tools.bin_dir), str(chat_model),
                                str(tmp_path)], env=dict(os.environ))
    try:
        server, port = _wait_healthy(psutil.Process(harness.pid))
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
        gone, alive = psutil.wait_procs([server], timeout=15)
        assert not alive, "llama-server outlived the harness"
        end = time.monotonic() + 10
        while not _port_free(port) and time.monotonic() < end:
            time.sleep(0.1)
        assert _port_free(port)
    finally:
        if harness.poll() is None:
            harness.kill()


def test_free_port_is_bindable():
    port = free_port()
    assert 1024 <= port <= 65535 and _port_free(port)
