"""The host lock keeps two measurements of one machine apart, and a dead holder never leaves the host locked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoinfer.campaign.spec import parse_campaign
from autoinfer.coordination import hostlock
from autoinfer.errors import UserError

HOLDER = """
import sys, time
from pathlib import Path
from autoinfer.coordination.hostlock import HostLock
with HostLock(sys.argv[2] == "1", Path(sys.argv[1])) as lock:
    print("acquired", time.time(), lock.waited_s, flush=True)
    time.sleep(float(sys.argv[3]))
    print("released", time.time(), flush=True)
"""


def hold(path: Path, enabled: bool, seconds: float) -> subprocess.Popen:
    """A process that takes the lock (or not), says so, keeps it `seconds`, says so."""
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "1" if enabled else "0", str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def line(proc: subprocess.Popen, word: str) -> list[float]:
    parts = proc.stdout.readline().split()
    assert parts and parts[0] == word, parts
    return [float(v) for v in parts[1:]]


def test_measurements_on_one_host_never_overlap(tmp_path):
    lock = tmp_path / "host.lock"
    first = hold(lock, True, 1.0)
    line(first, "acquired")
    second = hold(lock, True, 0.0)  # starts while the first one measures
    [first_released] = line(first, "released")
    second_acquired, second_waited = line(second, "acquired")
    assert second_acquired >= first_released and second_waited > 0
    for p in (first, second):
        p.communicate(timeout=60)


def test_concurrent_measurements_when_the_campaign_allows_them(tmp_path):
    lock = tmp_path / "host.lock"
    first = hold(lock, False, 60.0)
    line(first, "acquired")
    second = hold(lock, False, 0.0)
    _, waited = line(second, "acquired")  # while the first one still holds its (disabled) lock
    assert waited == 0 and first.poll() is None
    first.kill()
    for p in (first, second):
        p.communicate(timeout=60)


def test_a_killed_holder_releases_the_host(tmp_path):
    lock = tmp_path / "host.lock"
    holder = hold(lock, True, 60)
    line(holder, "acquired")
    holder.kill()
    holder.wait()
    with hostlock.HostLock(True, lock) as taken:
        assert taken.waited_s < 5


def test_lock_choice_per_campaign(monkeypatch, tmp_path):
    monkeypatch.setenv(hostlock.LOCK_ENV, str(tmp_path / "x.lock"))
    assert hostlock.for_campaign("llama-bench", False).enabled
    assert hostlock.for_campaign("llama-bench", False).path == tmp_path / "x.lock"
    assert not hostlock.for_campaign("llama-bench", True).enabled
    assert not hostlock.for_campaign("replay", False).enabled  # a table lookup measures nothing on the host


@pytest.mark.parametrize("workers, needle", [
    ({"allow_concurrent_on_host": "maybe"}, "workers.allow_concurrent_on_host"),
    ({"heartbeat_s": 0}, "workers.heartbeat_s"),
    ({"heartbeat_s": 10, "grace_s": 5}, "grace_s (5) must be longer than heartbeat_s (10)"),
    ({"queue": 1}, "workers.queue: unknown key"),
])
def test_bad_worker_keys_name_the_key(workers, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_campaign({"name": "x", "model": "a.gguf", "workers": workers})


def test_worker_keys_default():
    w = parse_campaign({"name": "x", "model": "a.gguf", "workers": {"heartbeat_s": 5}}).workers
    assert (w.allow_concurrent_on_host, w.heartbeat_s, w.grace) == (False, 5, 15)
