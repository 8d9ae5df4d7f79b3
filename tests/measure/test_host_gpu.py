"""Host description, hardware fingerprint, idle checks, and the NVML wrapper with and without a driver."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from autoinfer.measure import gpu
from autoinfer.measure.host import (
    HostInfo,
    cpu_busy_percent,
    fingerprint,
    host_info,
    other_gpu_processes,
    ram_limit_mib,
)
from autoinfer.measure.process import run_isolated

needs_gpu = pytest.mark.skipif(not gpu.nvml_available(), reason="needs an NVIDIA driver")


def test_host_info_matches_the_system():
    h = host_info()
    assert h.logical_cores == os.cpu_count()
    assert h.usable_cores == len(os.sched_getaffinity(0))
    assert h.ram_total_mib == psutil.virtual_memory().total / 2**20
    assert h.cpu_model and h.python == ".".join(map(str, sys.version_info[:3]))
    assert 0 < ram_limit_mib() <= h.ram_total_mib


def _host(ram_mib: float, cpu: str = "AMD EPYC 9654") -> HostInfo:
    return HostInfo(cpu, 16, 32, 16, ram_mib, "Linux 6", "3.11.7")


def test_fingerprint_is_stable_and_tells_hardware_classes_apart():
    h100 = gpu.GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-1", 81559.0, "580.1", "13.0")
    other_h100 = gpu.GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-2", 81559.0, "575.0", "12.9")
    a = fingerprint(_host(125.7 * 1024), [h100])
    assert a == fingerprint(_host(126.2 * 1024), [other_h100])  # reserved memory and driver differ, class does not
    assert a.as_dict() == {"cpu_model": "AMD EPYC 9654", "cpu_usable_cores": 16,
                           "gpus": ["NVIDIA H100 80GB HBM3 80 GiB"], "ram_gib": 128}
    assert len(a.digest) == 12
    assert a.digest != fingerprint(_host(125.7 * 1024), []).digest
    assert a.digest != fingerprint(_host(125.7 * 1024, "Intel Xeon"), [h100]).digest
    assert a.digest != fingerprint(_host(250 * 1024), [h100]).digest
    assert fingerprint().digest == fingerprint().digest


def test_cpu_busy_percent_sees_a_spinning_child():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = cpu_busy_percent(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert 100 / os.cpu_count() * 0.8 <= busy <= 100


@pytest.mark.skipif(gpu.nvml_available(), reason="checks the machine without an NVIDIA driver")
def test_without_a_driver_everything_is_empty():
    assert gpu.list_gpus() == [] and gpu.gpu_processes() == [] and other_gpu_processes() == []
    assert gpu.memory_used_mib(0) is None and gpu.process_memory_mib(0) is None and gpu.gpu_state(0) is None
    probe = gpu.DeviceMemoryProbe(0)
    assert not probe.available and probe.read({os.getpid()}) is None


@needs_gpu
def test_list_gpus_matches_nvidia_smi():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run([smi, "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    gpus = gpu.list_gpus()
    assert [(g.index, g.name, g.uuid, round(g.memory_total_mib)) for g in gpus] == [
        (int(i), name, uuid, int(total)) for i, name, uuid, total in rows]
    assert all(g.driver and g.cuda_version for g in gpus)
    state = gpu.gpu_state(0)
    assert state is not None and state.memory_used_mib is not None and state.sm_clock_mhz
    assert state.temperature_c is not None and 0 < state.temperature_c < 120


def _cuda_alloc_child(mib: int, hold_s: float) -> list[str]:
    """A child that allocates device memory through the CUDA driver API (libcuda, present with any driver)."""
    code = f"""
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({mib} << 20)) == 0
print("allocated", flush=True)
time.sleep({hold_s})
"""
    return [sys.executable, "-c", code]


@needs_gpu
def test_device_memory_peak_of_a_child():
    ctypes.CDLL("libcuda.so.1")  # the driver library this test needs
    res = run_isolated(_cuda_alloc_child(2048, 1.5), timeout_s=60, gpus=(0,))
    assert res.returncode == 0, res.stderr
    # 2 GiB of buffer plus the CUDA context (a few hundred MiB)
    assert 2048 <= res.vram_peak_mib < 2048 + 1024
    assert res.vram_method in ("per-process", "device-minus-baseline")
    assert any(s.vram_mib and s.vram_mib >= 2048 for s in res.samples)
