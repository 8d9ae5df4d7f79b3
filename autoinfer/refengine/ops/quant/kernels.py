"""Triton kernels that read GGUF-quantized weights directly (the blocks are decoded in registers, never stored):

- `qgemv` (ops/quant/gemv.py): batch-1 (or a few rows) products, the decode step's matmuls.
- `qgemm`: prefill matmuls; weight tiles decoded into the dtype of x and multiplied with tl.dot.
- `dequantize`: whole rows to a dense tensor (used where a dense op needs the weights, e.g. prefill experts).

They run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (how the tests check them against
gguf.quants). ops/quant/qweight.py documents the block layouts.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoinfer.errors import UserError
from autoinfer.refengine.ops.quant.gemv import qgemv
from autoinfer.refengine.ops.quant.qweight import BLOCKS, QuantWeight

_QTYPE_ID = {"Q8_0": 0, "Q4_K": 1, "Q6_K": 2}
GEMV_MAX_ROWS = 8  # up to this many rows of x a matmul is a (batched) GEMV; beyond it a GEMM


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_device(device: torch.device | str) -> None:
    """The kernels need a CUDA device, or the Triton interpreter for CPU tensors."""
    if torch.device(device).type != "cuda" and not interpreted():
        raise UserError("GGUF-quantized weights run through Triton kernels: use device: cuda "
                        "(or set TRITON_INTERPRET=1 to run them slowly on the CPU)")


@triton.jit
def _tile(u8, i8, f16, rows, row_bytes, blk, QTYPE: tl.constexpr, QK: tl.constexpr, BB: tl.constexpr):
    """Block `blk` of each row in `rows` ([BN] int64), decoded: [BN, QK] fp32."""
    base = rows[:, None] * row_bytes + blk * BB  # [BN, 1] byte offset of each row's block; always even
    j = tl.arange(0, QK)[None, :]
    if QTYPE == 0:  # Q8_0
        d = tl.load(f16 + base // 2).to(tl.float32)
        q = tl.load(i8 + base + 2 + j).to(tl.float32)
        w = d * q
    elif QTYPE == 1:  # Q4_K
        d = tl.load(f16 + base // 2).to(tl.float32)
        dmin = tl.load(f16 + base // 2 + 1).to(tl.float32)
        grp = j // 64
        hi = (j % 64) // 32
        s = 2 * grp + hi  # sub-block of 32 values
        q = (tl.load(u8 + base + 16 + 32 * grp + j % 32).to(tl.int32) >> (4 * hi)) & 0xF
        a = tl.load(u8 + base + 4 + s).to(tl.int32)
        b = tl.load(u8 + base + 8 + s).to(tl.int32)
        c = tl.load(u8 + base + 4 + (s + 4) % 8).to(tl.int32)
        low = s < 4
        scale = tl.where(low, a & 63, (b & 0xF) | ((c >> 6) << 4)).to(tl.float32)
        mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4)).to(tl.float32)
        w = d * scale * q.to(tl.float32) - dmin * mn
    else:  # Q6_K
        half = j // 128
        quarter = (j % 128) // 32
        lane = j % 32
        ql = (tl.load(u8 + base + 64 * half + lane + 32 * (quarter % 2)).to(tl.int32) >> (4 * (quarter // 2))) & 0xF
        qh = (tl.load(u8 + base + 128 + 32 * half + lane).to(tl.int32) >> (2 * quarter)) & 3
        scale = tl.load(i8 + base + 192 + 8 * half + lane // 16 + 2 * quarter).to(tl.float32)
        d = tl.load(f16 + (base + 208) // 2).to(tl.float32)
        w = d * scale * ((ql | (qh << 4)) - 32).to(tl.float32)
    return w


@triton.jit
def _gemm_kernel(x_ptr, u8, i8, f16, out_ptr, M, N, row_bytes, n_blocks, QTYPE: tl.constexpr, QK: tl.constexpr,
                 BB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """out[M, N] = x[M, K] @ W[N, K]ᵀ, one [BM, BN] tile per program, K walked one quant block at a time."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(n, N - 1).to(tl.int64)
    j = tl.arange(0, QK)
    K = n_blocks * QK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for blk in range(0, n_blocks):
        x = tl.load(x_ptr + m[:, None].to(tl.int64) * K + blk * QK + j[None, :], mask=m[:, None] < M, other=0.0)
        w = _tile(u8, i8, f16, rows, row_bytes, blk, QTYPE, QK, BB).to(x.dtype)
        acc += tl.dot(x, tl.trans(w))
    tl.store(out_ptr + m[:, None].to(tl.int64) * N + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(m[:, None] < M) & (n[None, :] < N))


@triton.jit
def _dequant_kernel(u8, i8, f16, out_ptr, n_rows, row_bytes, n_blocks, QTYPE: tl.constexpr, QK: tl.constexpr,
                    BB: tl.constexpr, BN: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = tl.minimum(n, n_rows - 1).to(tl.int64)
    j = tl.arange(0, QK)
    for blk in range(0, n_blocks):
        w = _tile(u8, i8, f16, rows, row_bytes, blk, QTYPE, QK, BB)
        tl.store(out_ptr + rows[:, None] * (n_blocks * QK) + blk * QK + j[None, :], w.to(out_ptr.dtype.element_ty),
                 mask=n[:, None] < n_rows)


def _views(w: QuantWeight):
    raw = w.raw.contiguous()
    return raw, raw.view(torch.int8), raw.view(torch.float16)


def _meta(w: QuantWeight) -> dict:
    qk, bb = BLOCKS[w.qtype]
    return dict(QTYPE=_QTYPE_ID[w.qtype], QK=qk, BB=bb)


def qgemm(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x [M, K] @ w[N, K]ᵀ → [M, N] in x's dtype."""
    N, K = w.shape
    raw, i8, f16 = _views(w)
    x = x.contiguous()
    M = x.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    BM = 16 if M <= 16 else 64
    BN = 64 if BLOCKS[w.qtype][0] == 256 else 128
    if interpreted():  # programs run one by one there, each at a fixed cost: fewer, larger ones
        BM, BN = max(16, min(triton.next_power_of_2(M), 64)), max(16, min(triton.next_power_of_2(N), 256))
    _gemm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](x, raw, i8, f16, out, M, N, raw.shape[-1],
                                                          w.blocks_per_row, BM=BM, BN=BN, **_meta(w))
    return out


def qlinear(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x @ wᵀ for x [M, K]: GEMV for a few rows (decode), GEMM for many (prefill)."""
    if x.shape[0] <= GEMV_MAX_ROWS:
        return qgemv(x, w)
    return qgemm(x, w)


def dequantize(w: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense [..., N, K] tensor."""
    raw, i8, f16 = _views(w)
    n_rows = raw.numel() // raw.shape[-1]
    out = torch.empty(w.shape, dtype=dtype, device=raw.device)
    BN = 128 if interpreted() else 16  # the interpreter runs programs one by one: fewer, larger ones there
    _dequant_kernel[(triton.cdiv(n_rows, BN),)](raw, i8, f16, out, n_rows, raw.shape[-1], w.blocks_per_row, BN=BN,
                                               **_meta(w))
    return out
