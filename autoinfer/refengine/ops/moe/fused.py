"""Fused MoE on experts kept in GGUF blocks (ops/quant/qweight.py).

Decode (one token): the router's choices stay on the device as an index tensor; gate and up of the k chosen
experts are one launch (a quantized GEMV of both stacks that picks the experts by that index and writes
SiLU(gate) ⊙ up), and down is one launch that also sums the k results under the routing weights. No host
synchronisation, 2 launches per layer whatever k.
Prefill (many tokens): the assignments are sorted by expert into blocks of rows of one expert, and each projection
is one grouped quantized GEMM over the stack (kernels.qgemm_grouped), reading the experts in their blocks: no
decoded copy of any expert, so a prefill needs no more device memory than the activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoinfer.errors import UserError
from autoinfer.refengine.ops.moe.bank import ExpertBank
from autoinfer.refengine.ops.quant.gemv import qgemv
from autoinfer.refengine.ops.quant.kernels import dequantize, group_by_matrix, qgemm_grouped
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
    block = 16 if row.numel() < 48 * bank.rows else 64  # ~the tokens one expert gets: little padding
    grouping = group_by_matrix(row, bank.rows, block)
    real = grouping.item >= 0
    item = grouping.item.clamp(min=0)
    x_rows = torch.where(real, token[item], -1)
    h = F.silu(qgemm_grouped(x, bank.gate, x_rows, grouping)) * qgemm_grouped(x, bank.up, x_rows, grouping)
    slots = torch.where(real, torch.arange(item.numel(), device=x.device), -1)
    out = qgemm_grouped(h, bank.down, slots, grouping).float() * torch.where(real, weight[item], 0.0)[:, None]
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return y.index_add_(0, torch.where(real, token[item], 0), out)
