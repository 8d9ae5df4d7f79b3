"""Run a measured child in its own process group: full output capture, timeout, memory peaks, guaranteed kill.

A trial must never outlive its budget or the harness, and its memory peaks decide feasibility, so:
- the child starts a new session (its own process group), and every stop kills the whole group, grandchildren
  included, also after the child exited on its own;
- PR_SET_PDEATHSIG makes the kernel SIGKILL the child when the harness dies, even by SIGKILL;
- stdout and stderr go to unlinked temporary files, so a chatty child never blocks on a full pipe;
- a sampler thread records RSS of the child tree and its device memory on each measured GPU at `sample_hz`, and
  the kernel's high-water mark of the child's resident memory (VmHWM), so a spike between two samples is not
  missed. (Not wait4's ru_maxrss: it counts the harness's own pages, which the forked child held until exec.)
  Where asked, it also reads how much of the child is on transparent huge pages: evidence that huge_pages=1 took.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal as signals
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping, Sequence

import psutil

from autoinfer.errors import UserError
from autoinfer.measure import crash as crashes
from autoinfer.measure.gpu import DeviceMemoryProbe

_MIB = 1024 * 1024
HUGE_PAGES_EVERY_S = 0.25  # smaps_rollup walks the page tables: huge pages are read at most this often...
HUGE_PAGES_SHARE = 0.25  # ...and early on every quarter of the time since the start: a run of 0.3 s (the small model
# on a fast host) then gets its weights read on huge pages, where a read every 0.25 s saw them on some runs only
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the child started
    rss_mib: float  # resident memory of the child and all its descendants
    vram_mib: float | None  # device memory of the tree, summed over the measured GPUs; None without a GPU


@dataclass(frozen=True)
class Peaks:
    rss_mib: float | None
    vram_mib: float | None  # the largest per-GPU peak: what a per-GPU memory budget is checked against
    vram_per_gpu_mib: tuple[float, ...] = ()  # peak on each measured GPU, in the order given


@dataclass(frozen=True)
class ProcessResult:
    argv: tuple[str, ...]
    returncode: int | None  # negative: killed by that signal (subprocess convention)
    signal: int | None  # the signal that ended the child, if one did
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float
    vram_peak_mib: float | None
    rss_peak_mib: float | None
    samples: tuple[Sample, ...]
    vram_method: str | None = None  # "per-process" or "device-minus-baseline"; None without a GPU
    vram_per_gpu_mib: tuple[float, ...] = ()  # peak on each measured GPU; vram_peak_mib is the largest
    crash: crashes.Crash | None = None  # why a child that died of a signal by itself died (not our stop's signal)
    huge_pages_peak_mib: float | None = None  # the most of the child on transparent huge pages; None unless asked


def _set_parent_death_signal(parent: int) -> None:
    """In the forked child: die with the harness. Also covers a harness that died before prctl ran."""
    _libc.prctl(_PR_SET_PDEATHSIG, signals.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(137)


def _descendants(pid: int) -> list[int]:
    """PIDs below `pid`. /proc/<pid>/task/<tid>/children is ~50× cheaper than psutil's full /proc scan, which
    matters at 20 Hz on a few cores; kernels built without it get the scan."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tids = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except FileNotFoundError:
                try:
                    return [p.pid for p in psutil.Process(pid).children(recursive=True)]
                except psutil.Error:
                    return found
            except OSError:
                continue
            found.extend(kids)
            stack.extend(kids)
    return found


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:  # vanished between listing and reading, or a zombie
            continue
    return total / _MIB


def _proc_mib(pid: int, name: str, field: str) -> float | None:
    """One `FIELD: N kB` line of /proc/<pid>/<name>, in MiB; None once the process has exited."""
    try:
        with open(f"/proc/{pid}/{name}") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _huge_pages_mib(pid: int) -> float | None:
    """Memory of one process on transparent huge pages (AnonHugePages of smaps_rollup). The kernel walks the
    process's page tables to answer, so the sampler reads it at most every HUGE_PAGES_EVERY_S (HUGE_PAGES_SHARE)."""
    return _proc_mib(pid, "smaps_rollup", "AnonHugePages")


def _high_water_mib(pid: int) -> float | None:
    """Peak resident memory of one process since its exec (VmHWM)."""
    return _proc_mib(pid, "status", "VmHWM")


class IsolatedProcess:
    """A long-running measured child (llama-server) with the isolation of `run_isolated`.

    Use as a context manager: leaving the block stops the child's whole process group, whatever ended the block
    (exception, KeyboardInterrupt). `stop()` is idempotent and returns the ProcessResult. The parent-death signal
    fires when the *thread* that started the child ends, so start it from a thread that outlives it.
    """

    def __init__(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
                 cwd: Path | str | None = None, gpus: Sequence[int] = (), sample_hz: float = 20.0,
                 term_grace_s: float = 3.0, huge_pages: bool = False) -> None:
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not one string (no shell is used)")
        self.argv = tuple(os.fspath(a) for a in argv)
        if not self.argv:
            raise ValueError("argv is empty")
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._gpus = tuple(gpus)
        self._interval = 1.0 / sample_hz
        self._grace = term_grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._out: IO[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._probes: list[DeviceMemoryProbe] = []
        self._samples: list[Sample] = []
        self._rss_peak: float | None = None
        self._vram_peaks: list[float | None] = [None] * len(self._gpus)
        self._hwm_peak: float | None = None
        self._huge_pages = huge_pages
        self._huge_peak: float | None = None
        self._huge_read_at = -HUGE_PAGES_EVERY_S
        self._stop_sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self._started = 0.0
        self._started_boot_s = 0.0
        self._died_by_itself = False
        self._ended: float | None = None
        self._timed_out = False
        self._result: ProcessResult | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "IsolatedProcess":
        if self._proc is not None:
            raise RuntimeError("already started")
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        self._probes = [DeviceMemoryProbe(i) for i in self._gpus]  # baselines taken before the child exists
        parent = os.getpid()
        try:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err, env=self._env,
                cwd=self._cwd, start_new_session=True, preexec_fn=lambda: _set_parent_death_signal(parent),
            )
        except OSError as exc:
            self._out.close()
            self._err.close()
            raise UserError(f"cannot start {self.argv[0]}: {exc.strerror}; check that the program exists "
                            "and is executable") from None
        self._started = time.monotonic()
        self._started_boot_s = crashes.boot_seconds()
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except OSError:  # kernels before 5.3 and gVisor: _exited polls waitid instead
            self._pidfd = None
        self._sample_once()
        self._sampler = threading.Thread(target=self._sample_loop, name=f"sampler-{self._proc.pid}", daemon=True)
        self._sampler.start()
        return self

    def __enter__(self) -> "IsolatedProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and not self._exited(0)

    @property
    def peaks(self) -> Peaks:
        """Peaks so far: the larger of the sampled tree RSS and the child's own high-water mark; device memory per
        GPU."""
        rss = max((v for v in (self._rss_peak, self._hwm_peak) if v is not None), default=None)
        per_gpu = tuple(v for v in self._vram_peaks if v is not None)
        return Peaks(rss, max(per_gpu) if per_gpu else None, per_gpu if len(per_gpu) == len(self._gpus) else ())

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(self._samples)

    def output(self) -> tuple[str, str]:
        """stdout and stderr written so far (the files stay open for the child)."""
        return self._read(self._out), self._read(self._err)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the child exits (True) or `timeout_s` passes (False); does not reap or kill."""
        if self._proc is None:
            raise RuntimeError("not started")
        return self._exited(timeout_s)

    def run_to_end(self, timeout_s: float) -> ProcessResult:
        """Wait for the child; past `timeout_s` mark the run timed out and kill the group."""
        if not self.wait(timeout_s):
            self._timed_out = True
        return self.stop()

    def stop(self) -> ProcessResult:
        """SIGTERM the group, SIGKILL it after the grace period, reap, stop sampling. Idempotent."""
        if self._result is not None:
            return self._result
        if self._proc is None:
            raise RuntimeError("not started")
        try:
            self._died_by_itself = self._exited(0)
            if not self._died_by_itself:
                self._signal_group(signals.SIGTERM)
                self._exited(self._grace)
        finally:
            # Unconditional: the leader if it ignored SIGTERM, and whatever it left behind. While the leader is
            # an unreaped zombie its group id cannot be reused, so this never hits a stranger.
            self._signal_group(signals.SIGKILL)
            self._reap()
            self._ended = self._ended or time.monotonic()
            self._stop_sampling.set()
            if self._sampler is not None:
                self._sampler.join()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        stdout, stderr = self.output()
        assert self._out is not None and self._err is not None
        self._out.close()
        self._err.close()
        rc = self._proc.returncode
        crash = None
        if rc is not None and rc < 0 and self._died_by_itself and not self._timed_out:
            crash = crashes.explain(-rc, stderr, self.argv[0], self._started_boot_s, self._env)
        peaks = self.peaks
        self._result = ProcessResult(
            argv=self.argv, returncode=rc, signal=-rc if rc is not None and rc < 0 else None,
            timed_out=self._timed_out, stdout=stdout, stderr=stderr, wall_s=self._ended - self._started,
            vram_peak_mib=peaks.vram_mib, rss_peak_mib=peaks.rss_mib, samples=tuple(self._samples),
            vram_method=next((p.method for p in self._probes if p.method), None),
            vram_per_gpu_mib=peaks.vram_per_gpu_mib, crash=crash, huge_pages_peak_mib=self._huge_peak,
        )
        return self._result

    # ------------------------------------------------------------------ internals

    def _exited(self, timeout_s: float | None) -> bool:
        """Has the child exited? Waits up to `timeout_s` without reaping it (the zombie keeps its group id)."""
        if self._ended is not None:
            return True
        if self._proc is None or self._proc.returncode is not None:
            return self._proc is not None
        if self._pidfd is not None:
            ready = bool(select.select([self._pidfd], [], [], timeout_s)[0])
        else:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not (ready := self._zombie()):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
        if ready and self._ended is None:
            self._ended = time.monotonic()
        return ready

    def _zombie(self) -> bool:
        assert self._proc is not None
        info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return info is not None

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        assert self._proc is not None
        self._proc.wait()

    def _sample_loop(self) -> None:
        """Samples densely at first (2, 4, 8 … ms), then at the set rate: a run of a few tens of milliseconds
        (a tiny model on an idle machine) still gets its high-water mark read after the model is loaded."""
        wait = min(0.002, self._interval)
        while not self._stop_sampling.wait(wait):
            if self._ended is not None:
                break
            self._sample_once()
            wait = min(wait * 2, self._interval)

    def _sample_once(self) -> None:
        assert self._proc is not None
        pids = [self._proc.pid, *_descendants(self._proc.pid)]
        rss = _rss_mib(pids)
        hwm = _high_water_mib(self._proc.pid)
        if hwm is not None:
            self._hwm_peak = max(hwm, self._hwm_peak or 0.0)
        now = time.monotonic()
        every = min(HUGE_PAGES_EVERY_S, HUGE_PAGES_SHARE * (now - self._started))
        if self._huge_pages and now - self._huge_read_at >= every:
            self._huge_read_at = now
            huge = _huge_pages_mib(self._proc.pid)
            if huge is not None:
                self._huge_peak = max(huge, self._huge_peak or 0.0)
        tree = set(pids)
        per_gpu = [probe.read(tree) for probe in self._probes]
        for i, vram in enumerate(per_gpu):
            if vram is not None:
                self._vram_peaks[i] = max(vram, self._vram_peaks[i] or 0.0)
        read = [v for v in per_gpu if v is not None]
        self._samples.append(Sample(time.monotonic() - self._started, rss, sum(read) if read else None))
        if rss > 0:
            self._rss_peak = max(rss, self._rss_peak or 0.0)

    @staticmethod
    def _read(fh: IO[bytes] | None) -> str:
        if fh is None or fh.closed:
            return ""
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        chunks, offset = [], 0
        while offset < size:
            chunk = os.pread(fd, min(size - offset, 1 << 24), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")


def run_isolated(argv: Sequence[str | os.PathLike[str]], *, timeout_s: float, env: Mapping[str, str] | None = None,
                 cwd: Path | str | None = None, gpus: Sequence[int] = (), sample_hz: float = 20.0,
                 huge_pages: bool = False) -> ProcessResult:
    """Run `argv` to completion in its own process group; past `timeout_s` the whole group is killed.

    Failures of the child are results (returncode, signal, timed_out), never exceptions; only a program that
    cannot be started at all raises UserError. `huge_pages`: also record how much of it was on huge pages.
    """
    with IsolatedProcess(argv, env=env, cwd=cwd, gpus=gpus, sample_hz=sample_hz, huge_pages=huge_pages) as proc:
        return proc.run_to_end(timeout_s)
