"""How the reference engine fills a device memory budget: everything but the routed experts on the device, the
sequence state at max_context, a reserve, and as many expert slots as the rest holds (all experts when they fit).

Sizes are the bytes as placed: matrices kept in GGUF blocks (weights: gguf; the embedding table too) count their
block bytes, decoded ones `dtype`'s size, norms/routers/conv fp32. `DevicePlan.from_gguf` plans from the file's
header before anything is loaded; `from_weights` measures the loaded tensors; the tests hold them equal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from autoinfer.errors import UserError
from autoinfer.model.arch import Architecture
from autoinfer.refengine.options import EngineOptions

# CUDA context (~500 MiB for a torch process on an H100), the caching allocator's slack and prefill activations:
# benchmarks/refengine_bench.py prints the measured peak against the budget, which is how this margin is checked.
RESERVE_MIB = 768
_EXPERT = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight$")
_FP32 = re.compile(r"(norm\.weight|ffn_gate_inp\.weight|ffn_gate_inp_shexp\.weight|ssm_conv1d\.weight|ssm_dt\.bias"
                   r"|ssm_a)$")  # what the loader keeps in fp32 (everything else is a matrix)
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class DevicePlan:
    other_bytes: int  # every tensor but the routed experts
    expert_bytes: int  # one routed expert (gate + up + down)
    n_experts: int  # routed experts of all layers
    n_used: int  # experts one token needs in a layer
    state_bytes: int  # KV cache at max_context positions and the GDN states
    reserve_bytes: int = RESERVE_MIB * 2**20

    def slots(self, budget_mib: float) -> int:
        """Expert slots that fit in `budget_mib`; 0 when every expert does (no cache needed)."""
        fixed = self.other_bytes + self.state_bytes + self.reserve_bytes
        free = budget_mib * 2**20 - fixed
        if free >= self.expert_bytes * self.n_experts:
            return 0
        slots = int(free // self.expert_bytes)
        if slots < self.n_used:
            raise UserError(f"a device budget of {budget_mib:.0f} MiB leaves room for {max(slots, 0)} experts after "
                            f"{fixed / 2**20:.0f} MiB of other weights, state and reserve; the model needs "
                            f"≥ {self.n_used}: raise the budget (or use weights: gguf, smaller than dense)")
        return slots

    def describe(self, budget_mib: float) -> dict:
        slots = self.slots(budget_mib)
        return {"budget_mib": budget_mib, "expert_slots": slots, "other_mib": self.other_bytes / 2**20,
                "state_mib": self.state_bytes / 2**20, "reserve_mib": self.reserve_bytes / 2**20,
                "expert_mib": self.expert_bytes / 2**20,
                "experts_on_device": self.n_experts if slots == 0 else slots, "n_experts": self.n_experts}

    @classmethod
    def from_gguf(cls, path: Path, options: EngineOptions) -> "DevicePlan":
        from autoinfer.model.gguf_info import read_info
        from autoinfer.refengine.loader import read_config
        from autoinfer.refengine.ops.quant.qweight import BLOCKS

        cfg, info = read_config(path), read_info(path)
        elt = _DTYPE_BYTES[options.dtype]

        def placed(t) -> int:
            if _FP32.search(t.name):
                return math.prod(t.shape) * 4
            if options.weights == "gguf" and t.ggml_type in BLOCKS:
                return t.n_bytes
            return math.prod(t.shape) * elt

        experts = sum(placed(t) for t in info.tensors if _EXPERT.search(t.name))
        other = sum(placed(t) for t in info.tensors if not _EXPERT.search(t.name))
        if not any(t.name == "output.weight" for t in info.tensors):  # tied: the lm_head is the table once more
            embd = next(t for t in info.tensors if t.name == "token_embd.weight")
            tied = embd.n_bytes if options.weights == "gguf" and embd.ggml_type in BLOCKS else math.prod(embd.shape) * elt
            other += tied
        n = cfg.n_layers * cfg.n_experts
        return cls(other, experts // n, n, cfg.n_experts_used, state_bytes(cfg, options))

    @classmethod
    def from_weights(cls, cfg: Architecture, sizes: list[tuple[str, int]], options: EngineOptions) -> "DevicePlan":
        """From (name, bytes) of the loaded tensors, with the names ModelWeights.map gives them."""
        experts = sum(b for name, b in sizes if is_routed_expert(name))
        other = sum(b for name, b in sizes if not is_routed_expert(name))
        n = cfg.n_layers * cfg.n_experts
        return cls(other, experts // n, n, cfg.n_experts_used, state_bytes(cfg, options))


def state_bytes(cfg: Architecture, options: EngineOptions) -> int:
    """KV cache of every attention layer at max_context positions, conv windows and recurrent states in fp32."""
    kv = 2 * cfg.n_kv_heads * options.max_context * cfg.head_dim * _DTYPE_BYTES[options.dtype]
    gdn = ((cfg.conv_kernel - 1) * cfg.conv_dim + cfg.gdn_v_heads * cfg.gdn_head_dim ** 2) * 4
    attention = len(cfg.attention_layers)
    return attention * kv + (cfg.n_layers - attention) * gdn


def is_routed_expert(name: str) -> bool:
    """layers.3.moe.gate, or layers.3.moe.gate.raw for a weight kept in GGUF blocks."""
    return ".moe." in name and name.split(".moe.", 1)[1].split(".")[0] in ("gate", "up", "down")
