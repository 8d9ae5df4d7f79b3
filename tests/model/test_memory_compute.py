"""The compute buffer's share of the memory model, against peaks measured on an H100 (benchmarks/tables)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from autoinfer.model.memory import MemoryModel
from autoinfer.model.shape import ModelShape
from autoinfer.trial_config import TrialConfig

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables"


def test_the_prior_frees_what_a_smaller_ubatch_freed_on_an_h100():
    """ubatch 256 against 1024 at 20 placements (`h100-35b-load.csv`; llama-bench's 512-token prompt caps 1024 at
    512): 228-242 MiB apart. llama.cpp's graph allocator reuses a buffer once its tensor is consumed, so the peak is
    the largest set alive at once (the output's logits with the last hidden state), not every per-token tensor
    summed: the sum put it at 271 MiB and sent sweeps to placements that then measured 20-24 MiB over the budget
    (benchmarks/results/vs-fit-h100.md, the run at 298348a)."""
    table = pd.read_csv(TABLES / "h100-35b-load.csv")
    model = MemoryModel(ModelShape.from_json((TABLES / "h100-35b-load.shape.json").read_text()), "device")
    errors = []
    for (placement, layers), rows in table.groupby(["placement", "cpu_expert_layers"]):
        peaks = rows.groupby("ubatch").vram_mib.median()
        if {256, 1024} <= set(peaks.index):
            configs = [TrialConfig.from_params({"model": "m", "n_prompt": 512, "n_gen": 32, "n_gpu_layers": 99,
                                                "flash_attn": "on", "placement": placement,
                                                "cpu_expert_layers": int(layers), "ubatch": ub}) for ub in (512, 256)]
            predicted, _ = model.difference(*configs)
            errors.append(predicted - (peaks[1024] - peaks[256]))
    assert len(errors) >= 15, errors
    assert statistics.median(abs(e) for e in errors) < 15, errors
    assert max(abs(e) for e in errors) < 25, errors
