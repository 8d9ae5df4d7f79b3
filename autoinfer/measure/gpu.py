"""NVIDIA GPUs through NVML (nvidia-ml-py): inventory, memory in use, per-process memory and a state snapshot.

Every function works on a machine without an NVIDIA driver: it answers an empty list or None instead of raising,
so the CPU-only path of the harness needs no special case. NVML is initialised once per process.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import pynvml

_MIB = 1024 * 1024
_lock = threading.Lock()
_state: dict[str, Any] = {"tried": False, "ok": False}


def nvml_available() -> bool:
    """True once NVML initialised; False (remembered) where the library or driver is missing."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                pynvml.nvmlInit()
                _state["ok"] = True
            except pynvml.NVMLError:
                _state["ok"] = False
        return bool(_state["ok"])


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_mib: float
    driver: str
    cuda_version: str  # the highest CUDA version the driver supports, e.g. "12.8"


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # as the driver sees it (the host's PID namespace inside containers)
    gpu_index: int
    used_mib: float | None  # None where the driver does not report per-process memory


@dataclass(frozen=True)
class GpuState:
    """What can make two runs of one configuration differ: clocks, heat, power, memory already in use."""

    index: int
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    energy_mj: int | None  # total energy counter since the driver loaded (Volta and newer)
    memory_used_mib: float | None
    utilization_percent: int | None
    pstate: int | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle(index: int) -> Any | None:
    if not nvml_available():
        return None
    try:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return None


def _maybe(fn: Any, *args: Any) -> Any | None:
    """One NVML query; None where this GPU or driver does not support it."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def list_gpus() -> list[GpuInfo]:
    """The NVIDIA GPUs of this machine, in NVML index order; empty without a driver."""
    if not nvml_available():
        return []
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    cuda = _maybe(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _maybe(pynvml.nvmlSystemGetCudaDriverVersion)
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append(GpuInfo(
            index=index,
            name=_text(pynvml.nvmlDeviceGetName(h)),
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(h).total / _MIB,
            driver=driver,
            cuda_version=cuda_text,
        ))
    return gpus


def visible_gpus() -> list[GpuInfo]:
    """The GPUs this worker may use: all of them, or those CUDA_VISIBLE_DEVICES names (NVML indices or UUIDs).

    Workers started per GPU (`autoinfer worker --gpus`) also set CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's numbering
    and NVML's agree.
    """
    gpus = list_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    picked = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        match = [g for g in gpus if (item.isdigit() and g.index == int(item)) or (not item.isdigit() and
                                                                                  g.uuid.startswith(item))]
        picked += [g for g in match if g not in picked]
    return picked


def measured_gpus() -> tuple[int, ...]:
    """NVML indices of the GPUs whose memory a trial's peaks are read from: every one this worker sees."""
    return tuple(g.index for g in visible_gpus())


def memory_used_mib(index: int) -> float | None:
    """Device memory in use by everything on GPU `index`."""
    h = _handle(index)
    info = _maybe(pynvml.nvmlDeviceGetMemoryInfo, h) if h is not None else None
    return info.used / _MIB if info is not None else None


def gpu_processes(index: int | None = None) -> list[GpuProcess]:
    """Compute and graphics processes on one GPU (or all), with their memory where the driver reports it."""
    if not nvml_available():
        return []
    indices = range(pynvml.nvmlDeviceGetCount()) if index is None else [index]
    out: dict[tuple[int, int], GpuProcess] = {}
    for i in indices:
        h = _handle(i)
        if h is None:
            continue
        for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            for p in _maybe(query, h) or []:
                used = p.usedGpuMemory
                out[(i, p.pid)] = GpuProcess(p.pid, i, used / _MIB if isinstance(used, int) else None)
    return list(out.values())


def process_memory_mib(index: int) -> dict[int, float] | None:
    """PID → device memory on GPU `index`, for processes whose memory the driver reports; None without NVML."""
    if _handle(index) is None:
        return None
    return {p.pid: p.used_mib for p in gpu_processes(index) if p.used_mib is not None}


def gpu_state(index: int) -> GpuState | None:
    """A snapshot of clocks, temperature, power and energy of GPU `index`; None without NVML."""
    h = _handle(index)
    if h is None:
        return None
    power = _maybe(pynvml.nvmlDeviceGetPowerUsage, h)
    limit = _maybe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    mem = _maybe(pynvml.nvmlDeviceGetMemoryInfo, h)
    util = _maybe(pynvml.nvmlDeviceGetUtilizationRates, h)
    return GpuState(
        index=index,
        sm_clock_mhz=_maybe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
        mem_clock_mhz=_maybe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
        max_sm_clock_mhz=_maybe(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
        temperature_c=_maybe(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        power_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        energy_mj=_maybe(pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
        memory_used_mib=mem.used / _MIB if mem is not None else None,
        utilization_percent=util.gpu if util is not None else None,
        pstate=_maybe(pynvml.nvmlDeviceGetPerformanceState, h),
    )


class DeviceMemoryProbe:
    """Device memory of a process tree on one GPU, read at sampling rate.

    Per-process figures are exact, but inside a container the driver reports host PIDs that never match the
    child's; then the probe falls back to device-wide memory minus the baseline taken when the probe was made
    (just before the child starts), which also counts anything else that allocates meanwhile. `method` says which
    one produced the peak.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self._handle = _handle(index)
        self.baseline_mib = memory_used_mib(index) if self._handle is not None else None
        self.method: str | None = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def read(self, pids: set[int]) -> float | None:
        """MiB used by `pids` (per process where the driver lists them, else device-wide minus baseline)."""
        if self._handle is None:
            return None
        per_process = process_memory_mib(self.index) or {}
        mine = [mib for pid, mib in per_process.items() if pid in pids]
        if mine:
            self.method = "per-process"
            return float(sum(mine))
        if self.method == "per-process":  # listed before, not now: the tree holds no device memory any more
            return 0.0
        used = memory_used_mib(self.index)
        if used is None or self.baseline_mib is None:
            return None
        if self.method is None:
            self.method = "device-minus-baseline"
        return max(0.0, used - self.baseline_mib)
