"""Sorted-token grouped GEMM: assignments sorted by expert row, then one grouped matmul per projection.

Uses torch.nn.functional.grouped_mm where this torch supports it for the device, dtype and shapes (bf16 on
SM90 CUDA, fp32 on CPU, 16-byte-aligned rows); otherwise a padded batched matmul over the experts in use.
`implementation()` says which one a call takes, so benchmarks report it.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

MAX_GROUPS = 512  # torch 2.11 grouped_mm refuses 1024 groups and more in one call (an expert cache can have thousands of slots)


@lru_cache(maxsize=None)
def _grouped_mm_works(device: str, dtype: torch.dtype, hidden: int, ffn: int) -> bool:
    if not hasattr(F, "grouped_mm"):
        return False
    a = torch.ones(4, hidden, dtype=dtype, device=device)
    b = torch.ones(2, ffn, hidden, dtype=dtype, device=device)
    try:
        F.grouped_mm(a, b.transpose(-2, -1), offs=torch.tensor([1, 4], dtype=torch.int32, device=device))
    except (RuntimeError, NotImplementedError):  # unsupported dtype/device/alignment in this torch build
        return False
    return True


def implementation(x: torch.Tensor, bank) -> str:
    ffn, hidden = bank.gate.shape[1:]
    ok = _grouped_mm_works(str(x.device), x.dtype, hidden, ffn) and _grouped_mm_works(
        str(x.device), x.dtype, ffn, hidden)
    return "grouped_mm" if ok else "padded_bmm"


def grouped_experts(x: torch.Tensor, token: torch.Tensor, row: torch.Tensor, weight: torch.Tensor,
                    bank, impl: str | None = None) -> torch.Tensor:
    """impl forces "grouped_mm" or "padded_bmm" (tests cover both); None picks what this torch supports."""
    order = torch.argsort(row, stable=True)
    token, row, weight = token[order], row[order], weight[order]
    xs = x[token]
    if (impl or implementation(x, bank)) == "grouped_mm":
        ends = torch.bincount(row, minlength=bank.rows).cumsum(0)
        out = torch.cat([_grouped(xs, ends, bank, r0, min(r0 + MAX_GROUPS, bank.rows))
                         for r0 in range(0, bank.rows, MAX_GROUPS)])
    else:
        out = _padded(xs, row, bank)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    y.index_add_(0, token, out.float() * weight[:, None].float())
    return y


def _grouped(xs: torch.Tensor, ends: torch.Tensor, bank, r0: int, r1: int) -> torch.Tensor:
    """Expert rows r0..r1 of the bank (one grouped_mm call handles at most MAX_GROUPS groups)."""
    if r0 == 0 and r1 == bank.rows:  # the common case: no slicing, no device sync
        a0, a1 = 0, xs.shape[0]
    else:
        a0, a1 = int(ends[r0 - 1]) if r0 else 0, int(ends[r1 - 1])
    offs = (ends[r0:r1] - a0).to(torch.int32)
    seg = xs[a0:a1]
    h = F.silu(F.grouped_mm(seg, bank.gate[r0:r1].transpose(-2, -1), offs=offs)) * F.grouped_mm(
        seg, bank.up[r0:r1].transpose(-2, -1), offs=offs)
    return F.grouped_mm(h, bank.down[r0:r1].transpose(-2, -1), offs=offs)


def _padded(xs: torch.Tensor, row: torch.Tensor, bank) -> torch.Tensor:
    """[A, E] rows sorted by expert → per-expert padded batch [U, m, E] → bmm → back to [A, E]."""
    used, counts = torch.unique_consecutive(row, return_counts=True)
    starts = counts.cumsum(0) - counts
    slot = torch.arange(row.shape[0], device=row.device) - starts.repeat_interleave(counts)
    group = torch.arange(used.shape[0], device=row.device).repeat_interleave(counts)
    padded = xs.new_zeros(used.shape[0], int(counts.max()), xs.shape[1])
    padded[group, slot] = xs
    h = F.silu(torch.bmm(padded, bank.gate[used].transpose(1, 2))) * torch.bmm(padded, bank.up[used].transpose(1, 2))
    return torch.bmm(h, bank.down[used].transpose(1, 2))[group, slot]
