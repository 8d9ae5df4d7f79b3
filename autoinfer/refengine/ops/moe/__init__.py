"""Routed-expert FFN variants, selectable by name. All share one signature:

    fn(x, token, row, weight, bank) -> y

x: [N, E] tokens; the A assignments (token[a], row[a], weight[a]) say that token[a] goes to the expert stored in
row[a] of `bank` with routing weight[a]. y: [N, E] fp32 = Σ_a weight[a] · down(SiLU(gate x) ⊙ up x). The bank is
either all experts of a layer or the slots of the expert cache. `loop` is the reference. `fused` runs on experts
kept in GGUF blocks (Triton kernels); the others, given such a bank, first decode the experts in use.
"""

from __future__ import annotations

from typing import Callable

import torch

from autoinfer.refengine.ops.moe.bank import ExpertBank
from autoinfer.refengine.ops.moe.fused import dense_bank, fused_experts, is_quantized
from autoinfer.refengine.ops.moe.grouped import grouped_experts
from autoinfer.refengine.ops.moe.loop import loop_experts
from autoinfer.refengine.ops.variants import pick

__all__ = ["ExpertBank", "MoeFn", "VARIANTS", "REFERENCE", "get"]

MoeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ExpertBank], torch.Tensor]

VARIANTS: dict[str, MoeFn] = {"loop": loop_experts, "grouped": grouped_experts, "fused": fused_experts}
REFERENCE = "loop"
READS_BLOCKS = {"fused"}  # variants that take a bank of GGUF blocks as it is
CAPTURE_SAFE = {"fused"}  # variants whose decode step reads nothing back to the host (a CUDA graph can record it)


def get(name: str) -> MoeFn:
    fn = pick("moe", VARIANTS, name)
    return fn if name in READS_BLOCKS else _decoding(fn)


def _decoding(fn: MoeFn) -> MoeFn:
    """fn on dense weights; a bank in GGUF blocks is decoded first (only the experts the assignments use)."""

    def run(x, token, row, weight, bank):
        if is_quantized(bank):
            bank, row = dense_bank(bank, row, x.dtype)
        return fn(x, token, row, weight, bank)

    return run
