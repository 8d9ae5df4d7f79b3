"""Is the machine quiet enough to measure on? Checked before every trial, and what was seen is recorded.

The study this project started from measured one configuration at 28.7 tok/s alone and 5.4 tok/s while another
program shared the machine. A trial next to another GPU process or on a busy CPU is not comparable with the
others, so the campaign waits, warns or refuses (campaign key `idle.policy`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import psutil

from autoinfer.errors import UserError
from autoinfer.measure.host import cpu_busy_percent, other_gpu_processes

POLICIES = ("wait", "warn", "refuse", "off")


@dataclass(frozen=True)
class IdleCheck:
    """One look at the machine. `busy_reasons` is empty when it was quiet."""

    cpu_percent: float  # whole machine, excluding this measurement's own processes
    own_cpu_percent: float  # this measurement's own processes (e.g. an injected load), whole-machine scale
    cpu_top: tuple[tuple[int, str, float], ...]  # (pid, name, % of one core) of the busiest other processes
    gpu_processes: tuple[tuple[int, int, float | None], ...]  # (pid, gpu index, MiB) of other GPU processes
    busy_reasons: tuple[str, ...]

    @property
    def busy(self) -> bool:
        return bool(self.busy_reasons)


def _busiest(interval_s: float, exclude: set[int], top: int = 3) -> tuple[float, float, list[tuple[int, str, float]]]:
    """Machine CPU %, the share of it used by `exclude`, and the busiest other processes over one interval
    (psutil needs two readings per process)."""
    procs = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            p.cpu_percent(None)
            procs.append(p)
        except psutil.Error:
            continue
    total = cpu_busy_percent(interval_s)
    usage, own = [], 0.0
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if p.pid in exclude:
            own += pct
        else:
            usage.append((p.pid, p.info["name"] or "?", pct))
    usage.sort(key=lambda u: -u[2])
    return total, own / (psutil.cpu_count() or 1), [u for u in usage[:top] if u[2] > 0]


def check(*, cpu_busy: float, interval_s: float = 0.5, exclude: set[int] | None = None) -> IdleCheck:
    """Look at the machine for `interval_s`. Busy: another GPU process, or CPU use above `cpu_busy` percent.

    `exclude` are PIDs that belong to this measurement (the harness, a load it injected on purpose): their GPU
    use is not another program's, and their CPU use is subtracted from the machine's.
    """
    exclude = set(exclude or ()) | {psutil.Process().pid}
    total, own, top = _busiest(interval_s, exclude)
    others = max(0.0, total - own)
    gpu = tuple((p.pid, p.gpu_index, p.used_mib) for p in other_gpu_processes(exclude))
    reasons = []
    if gpu:
        reasons.append(f"{len(gpu)} other process(es) on the GPU: PIDs {', '.join(str(g[0]) for g in gpu)}")
    if others > cpu_busy:
        names = ", ".join(f"{name} ({pid}) {pct:.0f}%" for pid, name, pct in top)
        reasons.append(f"CPU {others:.0f}% busy (over {cpu_busy:.0f}%){': ' + names if names else ''}")
    return IdleCheck(others, round(own, 1), tuple(top), gpu, tuple(reasons))


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
