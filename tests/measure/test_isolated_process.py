"""run_isolated / IsolatedProcess with real child processes: capture, timeouts, groups, memory peaks, cleanup."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from autoinfer.errors import UserError
from autoinfer.measure.gpu import nvml_available
from autoinfer.measure.process import IsolatedProcess, run_isolated

PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def _gone(pid: int) -> bool:
    """Not running: absent, or a zombie waiting for a reaper that is not us."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def test_large_output_on_both_streams_is_captured_whole():
    n = 8_000_000
    res = run_isolated(_py(f"""
        import sys
        for _ in range(8):
            sys.stdout.write("o" * ({n} // 8)); sys.stderr.write("e" * ({n} // 8))
        """), timeout_s=60)
    assert (res.returncode, res.signal, res.timed_out) == (0, None, False)
    assert res.stdout == "o" * n and res.stderr == "e" * n


def test_exit_status_and_signal():
    assert run_isolated(_py("raise SystemExit(7)"), timeout_s=30).returncode == 7
    res = run_isolated(_py("import os, signal; os.kill(os.getpid(), signal.SIGABRT)"), timeout_s=30)
    assert res.returncode == -signal.SIGABRT and res.signal == signal.SIGABRT and not res.timed_out


def test_timeout_kills_the_whole_group_with_grandchildren():
    res = run_isolated(_py("""
        import subprocess, sys, time
        kid = subprocess.Popen(["sleep", "300"])
        print(kid.pid, flush=True)
        time.sleep(300)
        """), timeout_s=1.0)
    assert res.timed_out and res.signal == signal.SIGTERM
    assert 1.0 <= res.wall_s < 5
    grandchild = int(res.stdout.split()[0])
    assert _wait_gone(grandchild, 2)


def test_a_child_ignoring_sigterm_gets_sigkill():
    res = run_isolated(_py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
        """), timeout_s=1.0)
    assert res.timed_out and res.signal == signal.SIGKILL
    assert res.wall_s < 1.0 + 3.0 + 2.0  # timeout + SIGTERM grace + slack


def test_what_the_child_left_behind_is_killed_when_it_exits():
    res = run_isolated(_py("""
        import subprocess
        print(subprocess.Popen(["sleep", "300"]).pid, flush=True)
        """), timeout_s=30)
    assert res.returncode == 0 and not res.timed_out
    assert _wait_gone(int(res.stdout.split()[0]), 2)


def test_rss_peak_of_the_tree_is_measured_and_sampled_often():
    res = run_isolated(_py("""
        import subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (200 << 20); time.sleep(1.5)"])
        block = b"y" * (100 << 20)
        time.sleep(1.0)
        kid.wait()
        """), timeout_s=60)
    assert res.returncode == 0
    # child 100 MiB + grandchild 200 MiB, both alive together; two interpreters add some tens of MiB
    assert 300 <= res.rss_peak_mib < 450
    assert max(s.rss_mib for s in res.samples) >= 300
    gaps = [b.t_s - a.t_s for a, b in zip(res.samples, res.samples[1:])]
    assert len(res.samples) >= 10 and statistics.median(gaps) <= 0.1


def test_kernel_peak_catches_a_spike_between_samples():
    """At 0.2 Hz the sampler reads at about 0, 2 ms … 1.0, 2.0, 4.1 s (dense at first), then 9.1 s. The spike comes
    6 s after the child started, and the child lives on to 11 s so that the 9.1 s sample reads its high-water mark
    (an exited child has none left to read): 1.5 s or more clear of every sample, however slowly a busy machine
    starts the interpreter."""
    res = run_isolated(_py("""
        import time
        time.sleep(6)
        spike = b"z" * (300 << 20)
        del spike
        time.sleep(5)
        """), timeout_s=60, sample_hz=0.2)
    assert res.returncode == 0
    assert max(s.rss_mib for s in res.samples) < 300  # no sample fell inside the spike
    assert res.rss_peak_mib >= 300


def test_harness_memory_does_not_count_as_the_childs():
    """The forked child holds the harness's pages until exec; a small program must not inherit that peak."""
    ballast = b"h" * (400 << 20)  # noqa: F841 — makes this harness big
    res = run_isolated(["sleep", "0.5"], timeout_s=30)
    assert res.rss_peak_mib < 50


def test_cwd_env_and_arguments_with_spaces(tmp_path):
    folder = tmp_path / "a folder; with spaces"
    folder.mkdir()
    res = run_isolated(_py("import os, sys; print(os.getcwd()); print(os.environ['X']); print(sys.argv[1])")
                       + ["one arg $(echo no) 'quoted'"], timeout_s=30, cwd=folder, env={"X": "y z"})
    assert res.stdout.splitlines() == [str(folder), "y z", "one arg $(echo no) 'quoted'"]


def test_bad_argv_and_missing_program():
    with pytest.raises(TypeError, match="not one string"):
        run_isolated("echo hi", timeout_s=5)
    with pytest.raises(UserError, match="cannot start"):
        run_isolated(["/nonexistent/program"], timeout_s=5)


def test_no_gpus_means_no_device_memory():
    assert run_isolated(["true"], timeout_s=10).vram_peak_mib is None


@pytest.mark.skipif(nvml_available(), reason="checks the machine without an NVIDIA driver")
def test_gpus_without_a_driver_are_harmless():
    res = run_isolated(["true"], timeout_s=10, gpus=(0,))
    assert res.returncode == 0 and res.vram_peak_mib is None and res.vram_method is None


def test_isolated_process_stops_on_exception_and_is_idempotent():
    proc = IsolatedProcess(_py("import time; print('up', flush=True); time.sleep(300)"))
    with pytest.raises(RuntimeError, match="boom"):
        with proc:
            end = time.monotonic() + 10
            while "up" not in proc.output()[0] and time.monotonic() < end:
                time.sleep(0.05)
            assert proc.running and proc.peaks.rss_mib > 0
            raise RuntimeError("boom")
    assert not proc.running and _gone(proc.pid)
    first = proc.stop()
    assert proc.stop() is first and first.signal == signal.SIGTERM and first.stdout == "up\n"


def test_isolated_process_stops_on_keyboard_interrupt():
    proc = IsolatedProcess(["sleep", "300"])
    with pytest.raises(KeyboardInterrupt):
        with proc:
            raise KeyboardInterrupt
    assert _gone(proc.pid)


def test_child_dies_with_a_harness_killed_by_sigkill(tmp_path):
    pid_file = tmp_path / "child.pid"
    harness = subprocess.Popen(_py(f"""
        import pathlib, time
        from autoinfer.measure.process import IsolatedProcess
        proc = IsolatedProcess(["sleep", "300"]).start()
        pathlib.Path({str(pid_file)!r}).write_text(str(proc.pid))
        time.sleep(300)
        """), cwd=Path(__file__).parents[2])
    try:
        end = time.monotonic() + 90  # a loaded machine can take a while to import
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < end and harness.poll() is None, "harness did not start its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert not _gone(child)
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        assert _wait_gone(child, 3)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
