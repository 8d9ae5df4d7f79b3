"""Is the machine quiet enough to measure on? Checked before every trial, and what was seen is recorded.

The study this project started from measured one configuration at 28.7 tok/s alone and 5.4 tok/s while another
program shared the machine. A trial next to another GPU process or on a busy CPU is not comparable with the
others, so the campaign waits, warns or refuses (campaign key `idle.policy`).

A check measures the CPU over the last `interval_s` up to the moment it is called. Watching for that long before
every trial would cost more than a tiny trial itself, so a daemon thread keeps snapshots of the CPU counters
(machine and per process, from /proc) a quarter second apart; a check takes one snapshot now and compares it with
the newest one at least `interval_s` old. It waits only when there is none (the first check, or after a long
trial), or when another program started inside that window and is running: it is then watched for a fresh one.
The thread stops after a while without checks, so it does not run beside long trials.

The window usually reaches back into the trial just measured; that trial's processes have ended and are the
harness's own, so their CPU is recorded apart (`ended_cpu_percent`) and does not make the machine look busy.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import NamedTuple

import psutil

from autoinfer.errors import UserError
from autoinfer.measure.host import other_gpu_processes

POLICIES = ("wait", "warn", "refuse", "off")
_PERIOD_S = 0.25  # snapshot spacing: a check's window is interval_s to interval_s + this long
_IDLE_STOP_S = 30.0  # the sampler stops this long after the last check
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class IdleCheck:
    """One look at the machine. `busy_reasons` is empty when it was quiet."""

    cpu_percent: float  # whole machine, excluding this measurement's own processes and the harness's ended ones
    own_cpu_percent: float  # this measurement's own processes (e.g. an injected load), whole-machine scale
    cpu_top: tuple[tuple[int, str, float], ...]  # (pid, name, % of one core) of the busiest other processes
    gpu_processes: tuple[tuple[int, int, float | None], ...]  # (pid, gpu index, MiB) of other GPU processes
    busy_reasons: tuple[str, ...]
    ended_cpu_percent: float  # the harness's child processes that ended in the window (the trial before)
    window_s: float  # how long the CPU was watched; the window ends when the check was made

    @property
    def busy(self) -> bool:
        return bool(self.busy_reasons)


# ------------------------------------------------------------------------------------------------ snapshots


class _Proc(NamedTuple):
    ppid: int
    name: bytes  # the kernel's short name (15 characters at most), decoded only for the few reported
    state: bytes  # R running, D waiting on a disk, S sleeping, Z exited and not yet waited for, ...
    ticks: int  # user + system CPU of the process itself
    reaped_ticks: int  # user + system CPU of its children it has waited for (the kernel adds them on wait)

    @property
    def inclusive(self) -> int:
        return self.ticks + self.reaped_ticks


_Key = tuple[int, int]  # (pid, start time in ticks): a reused PID is another process


@dataclass(frozen=True)
class _Snapshot:
    t: float  # time.monotonic()
    busy_s: float  # machine CPU counters, summed over cores
    total_s: float
    procs: dict[_Key, _Proc]


def _read_procs() -> dict[_Key, _Proc]:
    """Every process's CPU counters from /proc/<pid>/stat: one read each, a few times cheaper than psutil."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:  # exited since the listing
            continue
        try:
            stat = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        close = stat.rindex(b")")
        f = stat[close + 2:].split()  # f[0] is field 3 of proc(5)
        procs[(int(pid), int(f[19]))] = _Proc(int(f[1]), stat[stat.index(b"(") + 1:close], f[0],
                                              int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))
    return procs


def _snapshot() -> _Snapshot:
    cpu = psutil.cpu_times()
    total = sum(cpu) - getattr(cpu, "guest", 0.0) - getattr(cpu, "guest_nice", 0.0)  # guest is inside user
    t = time.monotonic()
    return _Snapshot(t, total - cpu.idle - getattr(cpu, "iowait", 0.0), total, _read_procs())


class _Sampler:
    """The ring of recent snapshots and the daemon thread that fills it while checks keep coming."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ring: deque[_Snapshot] = deque()
        self.running = False
        self.last_check = 0.0
        self.keep_s = 0.5

    def baseline(self, interval_s: float) -> _Snapshot:
        """The newest snapshot at least `interval_s` old (at most two periods older), waiting for one if needed."""
        with self.lock:
            now = self.last_check = time.monotonic()
            self.keep_s = max(self.keep_s, interval_s)
            if not self.running:
                self.running = True
                threading.Thread(target=self._run, name="autoinfer-idle-sampler", daemon=True).start()
            old = [s for s in self.ring if s.t <= now - interval_s]
            young = [s for s in self.ring if s.t > now - interval_s]
        if old and old[-1].t >= now - interval_s - 2 * _PERIOD_S:
            return old[-1]
        base = young[0] if young else _snapshot()
        time.sleep(max(0.0, base.t + interval_s - time.monotonic()))
        return base

    def _run(self) -> None:
        while True:
            snap = _snapshot()
            with self.lock:
                if snap.t - self.last_check > _IDLE_STOP_S:
                    self.ring.clear()
                    self.running = False
                    return
                self.ring.append(snap)
                while self.ring[0].t < snap.t - self.keep_s - 2 * _PERIOD_S:
                    self.ring.popleft()
            time.sleep(_PERIOD_S)


_sampler = _Sampler()


# ------------------------------------------------------------------------------------------------ one window


def _ended_children(s1: _Snapshot) -> set[_Key]:
    """The harness's descendants that have exited but are not waited for yet (a trial that just ended)."""
    children: dict[int, list[_Key]] = {}
    for key, p in s1.procs.items():
        children.setdefault(p.ppid, []).append(key)
    ended, todo = set(), [os.getpid()]
    while todo:
        for key in children.get(todo.pop(), []):
            todo.append(key[0])
            if s1.procs[key].state == b"Z":
                ended.add(key)
    return ended


def _waited_before(s0: _Snapshot, s1: _Snapshot) -> dict[_Key, int]:
    """Per process in both snapshots: what its descendants that were waited for in between had used before the
    window. Waiting adds a child's whole lifetime to the parent's counter; this is the part to take off again."""
    before: dict[_Key, int] = {}
    by_pid = {k[0]: k for k in s0.procs}
    for key in s0.procs.keys() - s1.procs.keys():
        ancestor = by_pid.get(s0.procs[key].ppid)
        while ancestor is not None and ancestor not in s1.procs:
            ancestor = by_pid.get(s0.procs[ancestor].ppid)
        if ancestor is not None:
            before[ancestor] = before.get(ancestor, 0) + s0.procs[key].inclusive
    return before


class _Window:
    """CPU use between two snapshots, split three ways: this measurement's own processes (the harness and
    `roots`), the harness's child processes that ended (the trial before), and other programs (the rest)."""

    def __init__(self, s0: _Snapshot, s1: _Snapshot, roots: set[int]) -> None:
        self.s0, self.s1, self.seconds = s0, s1, s1.t - s0.t
        self.waited = _waited_before(s0, s1)
        self.me = next(k for k in s1.procs if k[0] == os.getpid())
        self.own = {k for k in s1.procs if k[0] in roots} - {self.me}
        self.ended = _ended_children(s1) - self.own
        # the harness's own counter holds the children it waited for: those ended, they are not the harness
        self.own_pct = self.machine_percent(self.delta(self.me, "ticks") + sum(map(self.cpu, self.own)))
        self.ended_pct = self.machine_percent(self.reaped(self.me) + sum(map(self.cpu, self.ended)))
        total = 100.0 * (s1.busy_s - s0.busy_s) / max(s1.total_s - s0.total_s, 1e-9)
        self.others_pct = max(0.0, total - self.own_pct - self.ended_pct)

    def delta(self, key: _Key, counter: str) -> int:
        """Ticks a process in `s1` added to `counter` during the window (all of it when it started inside)."""
        before = getattr(self.s0.procs[key], counter) if key in self.s0.procs else 0
        return getattr(self.s1.procs[key], counter) - before

    def reaped(self, key: _Key) -> int:
        """The window's part of what the descendants a process waited for used."""
        return max(0, self.delta(key, "reaped_ticks") - self.waited.get(key, 0))

    def cpu(self, key: _Key) -> int:
        return self.delta(key, "ticks") + self.reaped(key)

    def core_percent(self, ticks: int) -> float:
        return 100.0 * ticks * _TICK_S / self.seconds

    def machine_percent(self, ticks: int) -> float:
        return self.core_percent(ticks) / (psutil.cpu_count() or 1)

    def others(self) -> dict[_Key, _Proc]:
        mine = self.own | self.ended | {self.me}
        return {k: p for k, p in self.s1.procs.items() if k not in mine}

    def started_inside(self) -> bool:
        """Whether another program started during the window and is running: not watched for a whole window."""
        return any(k not in self.s0.procs and p.state in (b"R", b"D") for k, p in self.others().items())

    def busiest(self, top: int = 3) -> list[tuple[int, str, float]]:
        """(pid, name, % of one core) of the busiest other processes."""
        usage = [(k[0], p.name.decode(errors="replace"), round(self.core_percent(self.delta(k, "ticks")), 1))
                 for k, p in self.others().items()]
        usage.sort(key=lambda u: -u[2])
        return [u for u in usage[:top] if u[2] > 0]


def _window(interval_s: float, roots: set[int]) -> _Window:
    """The CPU over the last `interval_s` or a little more; over the next `interval_s` when another program
    started inside that window, as its use so far says little about its use during the trial."""
    window = _Window(_sampler.baseline(interval_s), _snapshot(), roots)
    if window.started_inside():
        start = window.s1
        time.sleep(interval_s)
        window = _Window(start, _snapshot(), roots)
    return window


# ------------------------------------------------------------------------------------------------ the check


def check(*, cpu_busy: float, interval_s: float = 0.5, exclude: set[int] | None = None) -> IdleCheck:
    """Look at the machine over the last `interval_s`. Busy: another GPU process, or CPU use above `cpu_busy`.

    `exclude` are PIDs that belong to this measurement (the harness, a load it injected on purpose): their GPU
    use is not another program's, and their CPU use is subtracted from the machine's, as is the CPU of the
    harness's own child processes that have ended (the trial just measured).
    """
    exclude = set(exclude or ()) | {os.getpid()}
    window = _window(interval_s, exclude)
    others, top = round(window.others_pct, 1), window.busiest()
    gpu = tuple((p.pid, p.gpu_index, p.used_mib) for p in other_gpu_processes(exclude))
    reasons = []
    if gpu:
        reasons.append(f"{len(gpu)} other process(es) on the GPU: PIDs {', '.join(str(g[0]) for g in gpu)}")
    if others > cpu_busy:
        names = ", ".join(f"{name} ({pid}) {pct:.0f}%" for pid, name, pct in top)
        reasons.append(f"CPU {others:.0f}% busy (over {cpu_busy:.0f}%){': ' + names if names else ''}")
    return IdleCheck(others, round(window.own_pct, 1), tuple(top), gpu, tuple(reasons),
                     round(window.ended_pct, 1), round(window.seconds, 3))


def guard(policy: str, *, cpu_busy: float, wait_s: float, poll_s: float = 2.0,
          exclude: set[int] | None = None) -> dict[str, object]:
    """Apply the idle policy before a trial and return the record stored with it.

    wait: look again every `poll_s` until quiet, at most `wait_s`, then measure anyway and record that it was
    still busy. warn: measure and record. refuse: stop the campaign with a UserError (the study keeps what it
    has; rerun `autoinfer sweep` to resume). off: no check.
    """
    if policy not in POLICIES:
        raise UserError(f"idle.policy {policy!r} is not one of {', '.join(POLICIES)}")
    if policy == "off":
        return {"policy": "off"}
    started = time.monotonic()
    seen = check(cpu_busy=cpu_busy, exclude=exclude)
    if policy == "wait":
        while seen.busy and time.monotonic() - started < wait_s:
            time.sleep(poll_s)
            seen = check(cpu_busy=cpu_busy, exclude=exclude)
    if seen.busy and policy == "refuse":
        raise UserError(f"machine not idle before the trial ({'; '.join(seen.busy_reasons)}); stop the other "
                        "work and rerun `autoinfer sweep` to resume, or set idle.policy to wait or warn")
    return {
        "policy": policy,
        "busy": seen.busy,
        "waited_s": round(time.monotonic() - started, 3),
        **asdict(seen),
    }
