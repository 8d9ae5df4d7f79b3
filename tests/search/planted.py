"""A planted replay table: a 35B-A3B-shaped model on an 80 GB GPU, speeds from a bandwidth model plus noise.

This is a test input, not a result: it has the structure the anchors describe (1/tg grows linearly with the expert
bytes left in RAM; moving whole layers costs more than moving experts; the fastest fitting configuration sits on
the edge of the budget), so a search that knows the model and the memory can be checked against random search.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from autoinfer.engines.base import TrialConfig
from autoinfer.engines.replay import shape_path
from autoinfer.model.memory import MemoryModel
from autoinfer.model.placement import cpu_expert_layers, partial_layer
from autoinfer.model.shape import ModelShape, TensorBytes

N_LAYERS = 40
MIB = 1024 * 1024


def shape_35b() -> ModelShape:
    """The 35B-A3B layout with Q4_K-sized tensors (about 19.6 GB in all)."""
    tensors = [TensorBytes("token_embd.weight", None, "embeddings", 286_000_000),
               TensorBytes("output.weight", None, "output", 286_000_000),
               TensorBytes("output_norm.weight", None, "norm", 8192)]
    for i in range(N_LAYERS):
        attention = (i + 1) % 4 == 0
        tensors += [TensorBytes(f"blk.{i}.attn_norm.weight", i, "norm", 8192),
                    TensorBytes(f"blk.{i}.attn_q.weight" if attention else f"blk.{i}.attn_qkv.weight", i,
                                "attention" if attention else "gdn", 14_000_000),
                    TensorBytes(f"blk.{i}.ffn_gate_inp.weight", i, "router", 2_097_152),
                    TensorBytes(f"blk.{i}.ffn_up_shexp.weight", i, "shared_expert", 590_000),
                    TensorBytes(f"blk.{i}.ffn_gate_shexp.weight", i, "shared_expert", 590_000),
                    TensorBytes(f"blk.{i}.ffn_down_shexp.weight", i, "shared_expert", 860_000)]
        tensors += [TensorBytes(f"blk.{i}.ffn_{p}_exps.weight", i, "routed_experts", n)
                    for p, n in (("up", 151_000_000), ("gate", 151_000_000), ("down", 220_000_000))]
    return ModelShape(n_layers=N_LAYERS, n_experts=256, n_experts_used=8, hidden=2048, vocab=248320, n_head=16,
                      n_head_kv=2, key_length=256, value_length=256, expert_ff=512,
                      attention_layers=tuple(i for i in range(N_LAYERS) if (i + 1) % 4 == 0),
                      recurrent_state_bytes=4 * 32 * 128 * 128, tensors=tuple(tensors))


def planted_speeds(experts_cpu: float, whole: int, spread: bool, ubatch: int) -> tuple[float, float]:
    """Noise-free tg and pp: GPU reads, CPU reads of the experts of `experts_cpu` layers (a fraction for part of
    a layer), a whole-layer penalty, and a spread placement's cost; pp also grows with ubatch."""
    t = 1 / 240 + experts_cpu * 0.0003 + whole * 0.0016 + (0.0002 if spread else 0)
    return 1 / t, 9000 / (1 + experts_cpu * 0.02 + whole * 0.06) * (1 + 0.15 * np.log2(ubatch / 512))


def planted_table(folder: Path, seed: int = 0, partial: bool = False, split_cost: float = 0.0,
                  exact_memory: bool = False) -> Path:
    """Write planted.csv (+ planted.shape.json) into folder: n_gpu_layers × placement × cpu_expert_layers × ubatch
    (× partial_experts 0/1/2 with all layers on the GPU, where `partial`; a layer's gate and down in RAM without
    its up projections costs `split_cost` of tg, which byte counts do not show). Peaks are the memory model's prior
    off by 4% and 250 MiB, with noise; its prior itself where `exact_memory`."""
    rng = np.random.default_rng(seed)
    shape = shape_35b()
    truth = MemoryModel(shape, "device")  # its prior is the planted truth for memory (plus noise)
    experts = {t.name.split(".")[2]: t.n_bytes for t in shape.tensors if t.layer == 0 and t.group == "routed_experts"}
    share = {0: 0.0, 1: experts["ffn_down_exps"], 2: experts["ffn_down_exps"] + experts["ffn_gate_exps"]}
    rows = []
    for ngl in (41, 36, 32, 28):
        for placement in ("first", "last", "even"):
            for count in range(0, N_LAYERS + 1, 2):
                for parts in ((0, 1, 2) if ngl == 41 else (0,)) if partial else (None,):
                    for ubatch in (256, 512, 1024):
                        knobs = (("placement", placement), ("cpu_expert_layers", count))
                        knobs += (("partial_experts", parts),) if parts is not None else ()
                        config = TrialConfig(model=Path("m"), n_gpu_layers=ngl, ubatch=ubatch, extra=knobs)
                        cpu_layers = set(cpu_expert_layers(placement, count, N_LAYERS))
                        whole = max(N_LAYERS + 1 - ngl, 0)  # whole layers on the CPU
                        split = partial_layer(placement, cpu_layers, ngl, N_LAYERS) if parts else None
                        part = share[parts] / sum(experts.values()) if split is not None else 0.0
                        tg, pp = planted_speeds(len(cpu_layers | set(range(whole))) + part, whole,
                                                placement == "even", ubatch)
                        tg /= 1 + (split_cost if split is not None and parts == 2 else 0.0)
                        prior = truth.predict(config).mib
                        off = prior * 0.04 + 250 + rng.normal(0, 30)  # drawn either way: the same noise after it
                        vram = prior if exact_memory else prior + off
                        tg_s = tg * (1 + rng.normal(0, 0.04, 5))
                        pp_s = pp * (1 + rng.normal(0, 0.1, 5))
                        rows.append({"n_gpu_layers": ngl, "placement": placement, "cpu_expert_layers": count,
                                     **({"partial_experts": parts} if partial else {}),
                                     "ubatch": ubatch, "tg": float(np.median(tg_s)), "pp": float(np.median(pp_s)),
                                     "vram_mib": round(vram, 1),
                                     "tg_samples": " ".join(f"{v:.3f}" for v in tg_s),
                                     "pp_samples": " ".join(f"{v:.2f}" for v in pp_s)})
    path = Path(folder) / "planted.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    shape_path(path).write_text(shape.to_json())
    return path
