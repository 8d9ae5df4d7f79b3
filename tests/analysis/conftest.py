"""Studies for the analysis tests: synthetic speeds over the tiny model's real byte accounting, and the seed data."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

from autoinfer.model.placement import placement_bytes

# Planted truth of the synthetic placement study (seconds per token, GB/s).
T0_S, BW_CPU, BW_GPU = 0.002, 0.05, 0.5
MIB = 1024 * 1024


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="session")
def peer() -> Path:
    """The seed study's raw data: $AUTOINFER_PEER_DATA, else shared/peer-data beside the checkout (as CI has it);
    tests that need it skip with the reason when it is absent."""
    path = Path(os.environ.get("AUTOINFER_PEER_DATA") or Path(__file__).resolve().parents[3] / "shared" / "peer-data")
    if not path.is_dir():
        pytest.skip(f"shared/peer-data is absent here: no folder {path}; set AUTOINFER_PEER_DATA to it")
    return path


@pytest.fixture(scope="session")
def planted() -> dict[str, float]:
    return {"t0_s": T0_S, "BW_cpu_GBps": BW_CPU, "BW_gpu_GBps": BW_GPU}


@pytest.fixture(scope="session")
def placement_csv(tiny_model, tmp_path_factory) -> Path:
    """Every (n_gpu_layers, n_cpu_moe) of the tiny model, 3 repetitions each, speed from the bandwidth model."""
    from autoinfer.model.gguf_info import read_info

    info = read_info(tiny_model)
    rng = np.random.default_rng(7)
    rows = []
    for ngl in range(1, info.n_layers + 2):
        for ncmoe in range(0, info.n_layers + 1):
            pb = placement_bytes(info, ngl, ncmoe)
            speed = 1 / (T0_S + pb.active_cpu_gb / BW_CPU + pb.active_gpu_gb / BW_GPU)
            samples = speed * np.exp(rng.normal(0, 0.02, 3))
            rows.append({"model": str(tiny_model), "n_gpu_layers": ngl, "n_cpu_moe": ncmoe, "threads": 8,
                         "tg": ";".join(f"{s:.4f}" for s in samples),
                         "vram_mib": f"{pb.gpu_bytes / MIB + 100:.1f}", "outcome": "ok"})
    rows.append({"model": str(tiny_model), "n_gpu_layers": 0, "n_cpu_moe": 0, "threads": 8, "tg": "",
                 "vram_mib": "", "outcome": "oom"})
    return _write(tmp_path_factory.mktemp("csv") / "placement.csv", rows)


@pytest.fixture(scope="session")
def threads_csv(tmp_path_factory) -> Path:
    """One placement measured at 1–16 threads; past √(b/c) ≈ 10 threads it gets slower."""
    rng = np.random.default_rng(8)
    rows = []
    for t in (1, 2, 4, 6, 8, 12, 16):
        for _ in range(3):
            speed = 1 / (0.01 + 0.2 / t + 0.002 * t) * float(np.exp(rng.normal(0, 0.02)))
            rows.append({"model": "m.gguf", "n_gpu_layers": 99, "threads": t, "tg": f"{speed:.4f}"})
    return _write(tmp_path_factory.mktemp("csv") / "threads.csv", rows)


@pytest.fixture(scope="session")
def expert_table(tiny_model, tmp_path_factory) -> Path:
    """A table in the project's own format (benchmarks/make_table.py): `placement` and `cpu_expert_layers` columns,
    the model's path, result columns beside tg/pp (samples, spread, wall time, RAM peak). Speeds follow the
    bandwidth model over the experts each row keeps on the CPU."""
    from autoinfer.model.gguf_info import read_info
    from autoinfer.model.placement import cpu_expert_layers, expert_override

    info = read_info(tiny_model)
    rng = np.random.default_rng(11)
    rows = []
    for pattern in ("first", "last"):
        for count in range(info.n_layers + 1):
            pb = placement_bytes(info, 99, 0, expert_override(cpu_expert_layers(pattern, count, info.n_layers)))
            speed = 1 / (T0_S + pb.active_cpu_gb / BW_CPU + pb.active_gpu_gb / BW_GPU)
            samples = speed * np.exp(rng.normal(0, 0.02, 3))
            rows.append({"model": str(tiny_model), "n_gpu_layers": 99, "placement": pattern,
                         "cpu_expert_layers": count, "threads": 8, "tg": f"{np.median(samples):.4f}",
                         "tg_samples": " ".join(f"{s:.4f}" for s in samples), "tg_sd": f"{np.std(samples):.4f}",
                         "vram_mib": f"{pb.gpu_bytes / MIB + 100:.1f}", "rss_mib": "512.0",
                         "wall_s": f"{rng.uniform(5, 9):.2f}", "outcome": "ok"})
    return _write(tmp_path_factory.mktemp("csv") / "experts.csv", rows)
