"""Fused MoE on experts kept in GGUF blocks (ops/quant/qweight.py).

Decode (one token): the router's choices stay on the device as an index tensor; gate and up of the k chosen
experts are one launch (a quantized GEMV of both stacks that picks the experts by that index and writes
SiLU(gate) ⊙ up), and down is one launch that also sums the k results under the routing weights. No host
synchronisation, 2 launches per layer whatever k.
Prefill (many tokens): the experts in use are decoded to the activations' dtype and run through the grouped GEMM
variant (the decoded copy lives only for that call).
"""

from __future__ import annotations

import torch

from autoinfer.errors import UserError
from autoinfer.refengine.ops.moe.bank import ExpertBank
from autoinfer.refengine.ops.moe.grouped import grouped_experts
from autoinfer.refengine.ops.quant.gemv import qgemv
from autoinfer.refengine.ops.quant.kernels import dequantize
from autoinfer.refengine.ops.quant.qweight import QuantWeight


def is_quantized(bank) -> bool:
    return isinstance(bank.gate, QuantWeight)


def dense_bank(bank, row: torch.Tensor, dtype: torch.dtype):
    """The experts that `row` uses, decoded: (bank of those U experts, row renumbered into it)."""
    used, renumbered = torch.unique(row, return_inverse=True)
    return ExpertBank(*(dequantize(t[used], dtype) for t in (bank.gate, bank.up, bank.down))), renumbered


def fused_experts(x: torch.Tensor, token: torch.Tensor, row: torch.Tensor, weight: torch.Tensor,
                  bank) -> torch.Tensor:
    if not is_quantized(bank):
        raise UserError("moe variant 'fused' reads experts kept in GGUF blocks: set weights: gguf "
                        "(or use moe: grouped with dense weights)")
    if x.shape[0] == 1:
        h = qgemv(x, bank.gate, ids=row, up=bank.up)  # [k, F]: every item reads the one token
        return qgemv(h, bank.down, ids=row, coef=weight, out_dtype=torch.float32)
    dense, renumbered = dense_bank(bank, row, x.dtype)
    return grouped_experts(x, token, renumbered, weight, dense)
