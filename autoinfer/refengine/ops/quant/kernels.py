"""Triton kernels that read GGUF-quantized weights directly (the blocks are decoded in registers, never stored):

- `qgemv` (ops/quant/gemv.py): batch-1 (or a few rows) products, the decode step's matmuls.
- `qgemm`: prefill matmuls; weight tiles decoded into the dtype of x and multiplied with tl.dot.
- `qgemm_grouped`: the same over a stack of matrices (experts), each block of rows with its own matrix and rows of
  x gathered by index: the routed experts of a prefill, read in their blocks.
- `dequantize`: whole rows to a dense tensor (used where a dense op needs the weights, e.g. prefill experts).

They run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (how the tests check them against
gguf.quants). ops/quant/qweight.py documents the block layouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
def _tile(u8, i8, f16, rows, row_bytes, blk, start, QTYPE: tl.constexpr, BB: tl.constexpr, SUB: tl.constexpr):
    """Values start .. start + SUB of block `blk` of each row in `rows` ([BN] int64), decoded: [BN, SUB] fp32."""
    base = rows[:, None] * row_bytes + blk * BB  # [BN, 1] byte offset of each row's block; always even
    j = start + tl.arange(0, SUB)[None, :]
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
def _q4k_scale(u8, base, d, dmin, s: tl.constexpr):
    """Scale and min of sub-block s (0..7, known at compile time) of the Q4_K blocks at `base` ([BN] bytes):
    (d · scale, dmin · min), each [BN] fp32."""
    if s < 4:
        scale = tl.load(u8 + base + 4 + s).to(tl.int32) & 63
        mn = tl.load(u8 + base + 8 + s).to(tl.int32) & 63
    else:
        a = tl.load(u8 + base + 4 + s).to(tl.int32)  # scales[s]: its top bits
        c = tl.load(u8 + base + s).to(tl.int32)  # scales[s - 4]: its top bits
        b = tl.load(u8 + base + 8 + s).to(tl.int32)  # scales[s + 4]: the low bits
        scale = (b & 0xF) | ((c >> 6) << 4)
        mn = (b >> 4) | ((a >> 6) << 4)
    return d * scale.to(tl.float32), dmin * mn.to(tl.float32)


@triton.jit
def _gemm_kernel(x_ptr, u8, i8, f16, out_ptr, x_rows_ptr, block_matrix_ptr, M, N, row_bytes, n_blocks,
                 QTYPE: tl.constexpr, QK: tl.constexpr, BB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 GROUPED: tl.constexpr, SUB: tl.constexpr):
    """out[M, N] = x[M, K] @ W[N, K]ᵀ, one [BM, BN] tile per program, K walked one quant block at a time.
    GROUPED: output row m reads x row x_rows[m] (−1: a padding row, zeros) and the rows of the stack's matrix
    block_matrix[m // BM]: every BM-row block belongs to one matrix (one expert)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(n, N - 1).to(tl.int64)
    if GROUPED:
        x_row = tl.load(x_rows_ptr + m, mask=m < M, other=-1).to(tl.int64)
        rows += tl.load(block_matrix_ptr + pid_m).to(tl.int64) * N
    else:
        x_row = tl.where(m < M, m, -1).to(tl.int64)
    j = tl.arange(0, SUB)
    K = n_blocks * QK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if QTYPE == 1:  # Q4_K: each 64-value group is 32 bytes, low nibbles then high; scales decoded once a row
        h = tl.arange(0, 32)
        x_ok = x_row[:, None] >= 0
        for blk in range(0, n_blocks):
            base = rows * row_bytes + blk * BB  # [BN]
            d = tl.load(f16 + base // 2).to(tl.float32)
            dmin = tl.load(f16 + base // 2 + 1).to(tl.float32)
            for grp in tl.static_range(0, 4):
                q = tl.load(u8 + base[:, None] + 16 + 32 * grp + h[None, :]).to(tl.int32)  # [BN, 32]
                for half in tl.static_range(0, 2):
                    ds, dm = _q4k_scale(u8, base, d, dmin, 2 * grp + half)
                    w = ((q >> (4 * half)) & 0xF).to(tl.float32) * ds[:, None] - dm[:, None]
                    x = tl.load(x_ptr + x_row[:, None] * K + blk * QK + 64 * grp + 32 * half + h[None, :],
                                mask=x_ok, other=0.0)
                    acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    else:
        for blk in range(0, n_blocks):
            for start in tl.static_range(0, QK, SUB):  # a K-quant block in parts: a whole one spills at BN = 64
                x = tl.load(x_ptr + x_row[:, None] * K + blk * QK + start + j[None, :], mask=x_row[:, None] >= 0,
                            other=0.0)
                w = _tile(u8, i8, f16, rows, row_bytes, blk, start, QTYPE, BB, SUB).to(x.dtype)
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
        w = _tile(u8, i8, f16, rows, row_bytes, blk, 0, QTYPE, BB, QK)
        tl.store(out_ptr + rows[:, None] * (n_blocks * QK) + blk * QK + j[None, :], w.to(out_ptr.dtype.element_ty),
                 mask=n[:, None] < n_rows)


def _views(w: QuantWeight):
    raw = w.raw.contiguous()
    return raw, raw.view(torch.int8), raw.view(torch.float16)


def _meta(w: QuantWeight) -> dict:
    qk, bb = BLOCKS[w.qtype]
    return dict(QTYPE=_QTYPE_ID[w.qtype], QK=qk, BB=bb)


def _sub(w: QuantWeight) -> int:
    """Values of a block the GEMM decodes at a time: parts small enough not to spill on sm_90 (Q6_K's decode is the
    heaviest: 32; benchmarks/kernel_resources.py); interpreted, whole blocks (fewer steps)."""
    if interpreted():
        return BLOCKS[w.qtype][0]
    return min(32 if w.qtype == "Q6_K" else 64, BLOCKS[w.qtype][0])


def _gemm_tiles(w: QuantWeight, M: int, N: int) -> tuple[int, int]:
    BM = 16 if M <= 16 else 64
    BN = 64 if BLOCKS[w.qtype][0] == 256 else 128
    if interpreted():  # programs run one by one there, each at a fixed cost: fewer, larger ones
        BM, BN = max(16, min(triton.next_power_of_2(M), 64)), max(16, min(triton.next_power_of_2(N), 256))
    return BM, BN


def qgemm(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x [M, K] @ w[N, K]ᵀ → [M, N] in x's dtype."""
    N, K = w.shape
    raw, i8, f16 = _views(w)
    x = x.contiguous()
    M = x.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    BM, BN = _gemm_tiles(w, M, N)
    _gemm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](x, raw, i8, f16, out, raw, raw, M, N, raw.shape[-1],
                                                          w.blocks_per_row, BM=BM, BN=BN, GROUPED=False, SUB=_sub(w),
                                                          **_meta(w))
    return out


@dataclass(frozen=True)
class Grouping:
    """Assignments sorted by matrix and padded to whole blocks of `block` rows, each block one matrix: slot s holds
    assignment item[s] (−1: padding); block b multiplies by matrix matrix[b] of the stack."""

    item: torch.Tensor  # [S] int64
    matrix: torch.Tensor  # [S / block] int32
    block: int


def group_by_matrix(matrix_of: torch.Tensor, n_matrices: int, block: int) -> Grouping:
    """Sort assignments (matrix_of [A]: the stack matrix each uses) into blocks of one matrix. Reads the padded
    total back to the host once (a prefill step, not a graph)."""
    counts = torch.bincount(matrix_of, minlength=n_matrices)
    padded = (counts + block - 1) // block * block
    total = int(padded.sum())
    order = torch.argsort(matrix_of, stable=True)
    ranked = matrix_of[order]
    rank = torch.arange(order.numel(), device=order.device) - (counts.cumsum(0) - counts)[ranked]
    item = torch.full((total,), -1, dtype=torch.long, device=order.device)
    item[(padded.cumsum(0) - padded)[ranked] + rank] = order
    matrix = torch.repeat_interleave(torch.arange(n_matrices, device=order.device, dtype=torch.int32), padded // block,
                                     output_size=total // block)
    return Grouping(item, matrix, block)


def qgemm_grouped(x: torch.Tensor, w: QuantWeight, x_rows: torch.Tensor, grouping: Grouping) -> torch.Tensor:
    """Row s of the result = x[x_rows[s]] @ W[matrix of s's block]ᵀ (x_rows −1: zeros) → [S, N] in x's dtype,
    with W a stack [R, N, K] kept in its GGUF blocks: the experts of a prefill, never decoded to memory."""
    N, K = w.shape[-2:]
    raw, i8, f16 = _views(w)
    x = x.contiguous()
    S = x_rows.shape[0]
    out = torch.empty((S, N), dtype=x.dtype, device=x.device)
    BN = _gemm_tiles(w, grouping.block, N)[1]
    _gemm_kernel[(S // grouping.block, triton.cdiv(N, BN))](
        x, raw, i8, f16, out, x_rows.contiguous(), grouping.matrix, S, N, raw.shape[-1], w.blocks_per_row,
        BM=grouping.block, BN=BN, GROUPED=True, SUB=_sub(w), **_meta(w))
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
