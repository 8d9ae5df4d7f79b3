"""The idle check's cached windows: cheap in steady state, still a real measurement that ends at the check, and
the harness's own finished children are not another program. Real processes throughout; the machine is shared
with other work, so CPU amounts are asserted as bounds on what this test's own processes did."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from autoinfer.errors import UserError
from autoinfer.measure import idle

_SPIN = "import sys, time\nwhile time.process_time() < float(sys.argv[1]): pass"  # burns this much CPU, exits


def _spin(cpu_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _SPIN, str(cpu_s)])


def _cpu_s(percent: float, window_s: float) -> float:
    """CPU seconds during a window, from a whole-machine percentage."""
    return percent / 100 * window_s * psutil.cpu_count()


def _pids(seen: idle.IdleCheck) -> list[int]:
    return [pid for pid, _, _ in seen.cpu_top]


@pytest.fixture
def busy_loop():
    proc = _spin(1e9)
    yield proc
    proc.kill()
    proc.wait()


def test_a_program_that_just_started_is_watched_until_it_shows():
    idle.check(cpu_busy=100)  # the sampler is running, as it is between trials
    loop = _spin(1e9)
    try:
        time.sleep(0.05)  # running, but its CPU so far is too little to tell
        started = time.monotonic()
        seen = idle.check(cpu_busy=50 / psutil.cpu_count())  # half a core, on any number of cores
        took = time.monotonic() - started
    finally:
        loop.kill()
        loop.wait()
    assert loop.pid in _pids(seen) and seen.busy, seen
    assert 0.5 <= took < 1.0  # watched it for a fresh window instead of the cached one


def test_steady_state_check_is_fast_and_still_watches_half_a_second():
    idle.check(cpu_busy=50)
    took = []
    for _ in range(7):
        time.sleep(0.1)
        started = time.perf_counter()
        seen = idle.check(cpu_busy=50)
        took.append(time.perf_counter() - started)
        assert 0.5 <= seen.window_s < 1.0
    assert sorted(took)[3] < 0.2, took  # the median: a program starting elsewhere makes one look ahead


def test_a_running_child_counts_unless_excluded(busy_loop):
    idle.check(cpu_busy=100)
    time.sleep(0.6)  # the loop has run for the whole window
    seen = idle.check(cpu_busy=100)
    assert busy_loop.pid in _pids(seen)  # a running child may be a leftover competing with the next trial
    excluded = idle.check(cpu_busy=100, exclude={busy_loop.pid})
    assert busy_loop.pid not in _pids(excluded)
    assert _cpu_s(excluded.own_cpu_percent, excluded.window_s) > 0.1


def _window_around(child_cpu_s: float, *, reap: bool) -> tuple[idle._Window, int]:
    """Snapshots before and after a child of this process burnt `child_cpu_s` and exited (waited for or not)."""
    before = idle._snapshot()
    child = _spin(child_cpu_s)
    if reap:
        child.wait()
    else:
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
    window = idle._Window(before, idle._snapshot(), {os.getpid()})
    child.wait()
    return window, child.pid


@pytest.mark.parametrize("reap", [True, False], ids=["waited-for", "not-yet-waited-for"])
def test_a_child_that_just_ended_is_not_another_program(reap):
    window, pid = _window_around(0.3, reap=reap)
    assert pid not in [p for p, _, _ in window.busiest(top=1000)]
    ended_s = _cpu_s(window.ended_pct, window.seconds)
    assert ended_s >= 0.3 * 0.9, ended_s  # all of it, as it ran inside the window
    assert window.own_pct < 5  # the harness, which slept


def test_a_waited_for_child_counts_only_inside_the_window():
    """Waiting adds a child's whole lifetime to the parent's counter; only the window's part may count."""
    child = _spin(1.0)
    while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.5:  # user + system
        time.sleep(0.01)
    before = idle._snapshot()
    child.wait()
    window = idle._Window(before, idle._snapshot(), {os.getpid()})
    ended_s = _cpu_s(window.ended_pct, window.seconds)
    assert 0.0 < ended_s <= min(window.seconds, 0.5) + 0.05, ended_s  # one core at most, and only what was left


def test_policies_on_the_cached_window(busy_loop):
    idle.check(cpu_busy=100)
    time.sleep(0.5)  # the cached window starts after the loop did: nothing new to watch for
    quiet = idle.guard("wait", cpu_busy=100, wait_s=5)  # nothing is over 100%: quiet at the first look
    assert not quiet["busy"] and quiet["waited_s"] < 1.0 and quiet["window_s"] >= 0.5  # did not look again
    waited = idle.guard("wait", cpu_busy=1, wait_s=0.6, poll_s=0.2)
    assert waited["busy"] and waited["waited_s"] >= 0.6  # looked again until the time was up
    with pytest.raises(UserError, match="not idle") as refused:
        idle.guard("refuse", cpu_busy=1, wait_s=0)
    assert "\n" not in str(refused.value)


def test_the_sampler_does_not_keep_python_alive():
    code = "from autoinfer.measure import idle; print(idle.check(cpu_busy=100).window_s)"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= 0.5  # the first check had no earlier snapshot and watched the full time
    assert time.monotonic() - started < 10  # exited without waiting for the sampler thread
