"""One measuring trial per host: two trials that run at once on one machine share its memory bandwidth, PCIe and
CPU cores, and each reports the other's interference as its own speed.

Workers on one host (one per GPU, or several started by hand) take an exclusive file lock for the duration of each
measurement; the others wait. The lock file lives in /tmp (one per machine, whatever the user) unless
AUTOINFER_HOST_LOCK names another path. The kernel drops a flock when its holder dies, so a killed worker never
leaves the host locked. A campaign may allow concurrent measurements (workers.allow_concurrent_on_host), e.g. when
each GPU's trials are known not to touch the CPU. The replay engine measures nothing on the host, so it never locks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Callable

from filelock import FileLock, Timeout

from autoinfer.engines.base import capabilities

LOCK_ENV = "AUTOINFER_HOST_LOCK"
DEFAULT_LOCK = Path("/tmp/autoinfer-host.lock")


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


class HostLock:
    """An exclusive lock on the host's lock file, taken around one measurement; `waited_s`: how long it waited."""

    def __init__(self, enabled: bool, path: Path | None = None, note: Callable[[str], None] | None = None) -> None:
        self.enabled = enabled
        self.path = path or lock_path()
        self.note = note
        self.waited_s = 0.0
        self.acquired_at: float | None = None  # time.time() when the last take succeeded
        self._lock: FileLock | None = None

    def __enter__(self) -> "HostLock":
        self.waited_s = 0.0
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path, mode=0o666)  # workers of other users on the same host share it
        started = time.monotonic()
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if self.note is not None:
                self.note(f"another trial is measuring on this host ({self.path}); waiting for it")
            lock.acquire()
        self.waited_s = time.monotonic() - started
        self.acquired_at = time.time()
        self._lock = lock
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def for_campaign(engine: str, allow_concurrent: bool, note: Callable[[str], None] | None = None) -> HostLock:
    """The lock a sweep takes around each measurement (disabled where the campaign allows concurrency or the engine
    measures nothing on the host)."""
    return HostLock(enabled=not allow_concurrent and capabilities(engine).host_measurement, note=note)
