"""The environment of one trial: everything that can make two runs of one configuration differ.

A number without its machine state cannot be compared with another one: clocks and temperature say whether the
GPU throttled, the energy counter turns tok/s into tokens per joule, the build commit and model hash say whether
two trials even ran the same thing. Recorded at the start and end of every trial and stored with it.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import autoinfer
from autoinfer.measure.gpu import GpuState, gpu_state, list_gpus
from autoinfer.measure.host import host_info

_HASH_CHUNK = 1 << 20  # 1 MiB
_HASH_CHUNKS = 8


@functools.lru_cache(maxsize=32)
def _fast_hash(path: str, size: int, mtime_ns: int) -> str:
    del mtime_ns  # part of the cache key only: a rewritten file is hashed again
    h = hashlib.blake2b(digest_size=16)
    h.update(str(size).encode())
    with open(path, "rb") as fh:
        for k in range(_HASH_CHUNKS):
            fh.seek(max(0, size - _HASH_CHUNK) * k // (_HASH_CHUNKS - 1))
            h.update(fh.read(_HASH_CHUNK))
    return h.hexdigest()


def model_fingerprint(path: Path) -> dict[str, Any]:
    """Size and a fast content hash (size + 8 evenly spaced 1 MiB chunks, blake2b): a 20 GB GGUF in milliseconds.

    Not a full checksum: it tells different files apart (different quantisation, seed, header), which is what a
    comparison of trials needs, without reading every byte before each trial.
    """
    if not Path(path).is_file():  # a label, not a file (a replay table's model names the measured file elsewhere)
        return {"path": str(path), "bytes": None, "hash": None}
    st = Path(path).stat()
    return {"path": str(path), "bytes": st.st_size, "hash": _fast_hash(str(path), st.st_size, st.st_mtime_ns)}


@dataclass(frozen=True)
class EnvironmentStart:
    """What `begin` saw; `finish` turns it into the stored record."""

    wall_time: float
    monotonic: float
    gpus: tuple[GpuState | None, ...]  # one snapshot per measured GPU


def begin(gpus: tuple[int, ...]) -> EnvironmentStart:
    """Snapshot just before the trial starts."""
    return EnvironmentStart(time.time(), time.monotonic(), tuple(gpu_state(i) for i in gpus))


def _build(tools: Any) -> dict[str, Any] | None:
    if tools is None:
        return None
    return {"commit": tools.commit, "flags": list(tools.flags), "cuda": bool(tools.cuda), "bin_dir": str(tools.bin_dir)}


def _gpu_record(index: int, start: GpuState | None, end: GpuState | None, tokens: int | None) -> dict[str, Any]:
    info = next((g for g in list_gpus() if g.index == index), None)
    e0 = start.energy_mj if start else None
    e1 = end.energy_mj if end else None
    joules = (e1 - e0) / 1000.0 if e0 is not None and e1 is not None and e1 > e0 else None
    return {
        "index": index,
        "name": info.name if info else None,
        "driver": info.driver if info else None,
        "cuda": info.cuda_version if info else None,
        "memory_total_mib": info.memory_total_mib if info else None,
        "start": asdict(start) if start else None,
        "end": asdict(end) if end else None,
        "energy_j": joules,
        "tokens_per_joule": tokens / joules if joules and tokens else None,
    }


def finish(start: EnvironmentStart, *, gpus: tuple[int, ...], model: Path, tools: Any = None,
           tokens: int | None = None) -> dict[str, Any]:
    """The trial's environment record (JSON-ready).

    `tools` is the llama.cpp build the engine ran (autoinfer.llama.binaries.Tools) or None for engines without
    one. `tokens` is every token the engine processed (warm-up included); with the GPU energy counters it gives
    tokens per joule of device energy over the whole trial, model load included. `gpu` describes the first
    measured GPU, with energy and tokens per joule summed over all of them; `gpus` lists each one.
    """
    records = [_gpu_record(i, s, gpu_state(i), tokens) for i, s in zip(gpus, start.gpus)]
    gpu: dict[str, Any] | None = None
    if records:
        energies = [r["energy_j"] for r in records]
        joules = sum(energies) if None not in energies else None
        gpu = {**records[0], "count": len(records), "energy_j": joules,
               "tokens_per_joule": tokens / joules if joules and tokens else None}
    return {
        "started_at": start.wall_time,
        "duration_s": time.monotonic() - start.monotonic,
        "gpu": gpu,
        "gpus": records,
        "host": asdict(host_info()),
        "build": _build(tools),
        "model": model_fingerprint(model),
        "autoinfer": autoinfer.__version__,
        "tokens": tokens,
    }
