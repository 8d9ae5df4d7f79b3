"""The host: what it is (for records), which hardware class it belongs to (for refusing to mix machines in one
study), and whether it is quiet enough to measure on."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autoinfer.measure.gpu import GpuInfo, GpuProcess, gpu_processes, list_gpus

_MIB = 1024 * 1024


@dataclass(frozen=True)
class HostInfo:
    cpu_model: str
    physical_cores: int | None
    logical_cores: int
    usable_cores: int  # CPUs this process may run on (affinity / container limits)
    ram_total_mib: float
    os: str
    python: str


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info() -> HostInfo:
    return HostInfo(
        cpu_model=_cpu_model(),
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True) or 1,
        usable_cores=len(os.sched_getaffinity(0)),
        ram_total_mib=psutil.virtual_memory().total / _MIB,
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
    )


def usable_physical_cores() -> int:
    """Physical cores this process may run on: the usable logical CPUs (affinity, container limits) less their
    hyper-threads, at the machine's ratio of physical to logical cores."""
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    return max(1, round(len(os.sched_getaffinity(0)) * physical / logical))


def ram_limit_mib() -> float:
    """Memory this process tree may use: physical RAM, or a smaller cgroup (container) limit."""
    limit = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit / _MIB


@dataclass(frozen=True)
class Fingerprint:
    """The hardware class of a machine. Sizes are rounded up (RAM to 4 GiB, VRAM to 1 GiB) because the
    reported totals sit a little below the installed size and vary with kernel and driver reservations."""

    fields: tuple[tuple[str, Any], ...]
    digest: str  # 12 hex characters of SHA-256 over the fields

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.fields}


def fingerprint(host: HostInfo | None = None, gpus: list[GpuInfo] | None = None) -> Fingerprint:
    """A stable identity of the hardware class: GPU models and memory, CPU model and usable cores, RAM size."""
    host = host or host_info()
    gpus = list_gpus() if gpus is None else gpus
    fields = (
        ("cpu_model", host.cpu_model),
        ("cpu_usable_cores", host.usable_cores),
        ("gpus", tuple(f"{g.name} {math.ceil(g.memory_total_mib / 1024)} GiB" for g in gpus)),
        ("ram_gib", 4 * math.ceil(host.ram_total_mib / 1024 / 4)),
    )
    text = json.dumps(fields, sort_keys=True)
    return Fingerprint(fields, hashlib.sha256(text.encode()).hexdigest()[:12])


def cpu_busy_percent(interval_s: float = 0.5) -> float:
    """Whole-machine CPU use over `interval_s` (blocks that long); 100 means every core busy."""
    return psutil.cpu_percent(interval=interval_s)


def other_gpu_processes(exclude: set[int] | None = None) -> list[GpuProcess]:
    """Processes on any GPU other than this one (and `exclude`): a measurement next to them is not clean."""
    skip = {os.getpid(), *(exclude or set())}
    return [p for p in gpu_processes() if p.pid not in skip]


THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_refusal(mode_file: Path = THP_MODE, libc: tuple[str, str] | None = None) -> str | None:
    """Why malloc gets no transparent huge pages on this host (engines.llama_common.HUGE_PAGES asks glibc for them),
    None where it does: the kernel's THP mode must be `madvise` or `always`, and the C library glibc 2.35 or later
    (an older glibc ignores the tunable, and the trials would run without huge pages)."""
    try:
        mode = re.search(r"\[(\w+)\]", mode_file.read_text())
    except OSError:
        mode = None
    if mode is None:
        return f"this kernel has no transparent huge pages ({mode_file} unreadable)"
    if mode.group(1) == "never":
        return f"transparent huge pages are off on this host ({mode_file}: never)"
    name, version = libc or platform.libc_ver()
    parts = [int(x) for x in re.findall(r"\d+", version)[:2]]
    if name != "glibc" or parts < [2, 35]:
        return f"the C library is {name or 'not glibc'} {version}".rstrip() + ", and glibc.malloc.hugetlb needs glibc 2.35"
    return None
