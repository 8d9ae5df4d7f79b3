"""Batch-1 products with weights in GGUF blocks (Q8_0, Q4_K, Q6_K): the matmuls of a decode step, bound by the bytes
of weights they read. One launch reads each weight byte once:

- rows are split over many programs, several rows per program (`BN`), and each loop step decodes `NB` blocks of
  every row at once, so a program has several KB of independent loads in flight;
- block data is loaded as whole runs of bytes (16-byte vectors where the block layout is 16-byte aligned: Q4_K's
  nibbles), headers (scales) as words;
- integers become floats through the bits of 2^23 + q (an OR and a subtraction) instead of a conversion
  instruction, which runs at an eighth of the FMA rate on Hopper;
- "items" are matrices picked from a stack by a device index tensor (the experts a router chose): all items of a
  row tile are rows of the same program, so their results can be summed under routing weights in registers, with
  no host synchronisation and no atomics (the sum is deterministic);
- `glu` reads two stacks (gate and up) and writes SiLU(gate·x) ⊙ (up·x): an expert's first half in one launch.

No K split: the model's matrices with few rows (β/α projections, 32 × 2048) are a few tens of KB, where a launch's
fixed cost dominates whatever the grid. The reference is dequantization (kernels.dequantize, checked against
gguf.quants) followed by a dense product; tests/refengine/test_quant_kernels.py compares them on random blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.qweight import QuantWeight

_QTYPE_ID = {"Q8_0": 0, "Q4_K": 1, "Q6_K": 2}


@triton.jit
def _float(u, bias: tl.constexpr):
    """u − bias as fp32 for integers 0 ≤ u < 2^23: the bits 0x4B000000 | u are the float 2^23 + u."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + bias)


@triton.jit
def _x(x_ptr, xoff, idx, ok, X_SHARED: tl.constexpr):
    """Activations at element offsets idx ([C, W]) for every virtual row: [1, C, W] when all rows read one x,
    else [R, C, W] (xoff [R]: where each row's x starts). Blocks past the row end (ok false) read 0."""
    if X_SHARED:
        x = tl.load(x_ptr + idx, mask=ok[:, None], other=0.0).to(tl.float32)[None, :, :]
    else:
        x = tl.load(x_ptr + xoff[:, None, None] + idx[None, :, :], mask=ok[None, :, None], other=0.0)
        x = x.to(tl.float32)
    return x


@triton.jit
def _q8_0(w16, f16, base, x_ptr, xoff, b0, n_blocks, NB: tl.constexpr, X_SHARED: tl.constexpr):
    """Σ over blocks b0..b0+NB of each row: Q8_0 = fp16 d, then 32 int8 (34 bytes; blocks are only 2-byte aligned,
    so the quants are read as 16 int16 pairs)."""
    c = tl.arange(0, NB)
    blk = b0 + c
    ok = blk < n_blocks
    blk = tl.minimum(blk, n_blocks - 1)
    j = tl.arange(0, 16)
    boff = base[:, None] + blk[None, :] * 34  # [R, C] byte offset of each block
    pair = tl.load(w16 + boff[:, :, None] // 2 + 1 + j[None, None, :]).to(tl.int32)  # [R, C, 16]
    even = _float((pair ^ 0x80) & 0xFF, 128.0)  # the low byte, an int8, as q + 128 in 0..255
    odd = _float(((pair >> 8) ^ 0x80) & 0xFF, 128.0)
    idx = blk[:, None] * 32 + 2 * j[None, :]
    dot = tl.sum(even * _x(x_ptr, xoff, idx, ok, X_SHARED) + odd * _x(x_ptr, xoff, idx + 1, ok, X_SHARED), axis=2)
    d = tl.load(f16 + boff // 2).to(tl.float32)
    return tl.sum(d * dot, axis=1)


@triton.jit
def _q4_k_scale(w0, w1, w2, i, low):
    """6-bit (scale, min) of sub-block s from the 12 packed bytes (words w0..w2): byte i = s mod 4 of each word;
    sub-blocks 0-3 (low) keep 6 bits in w0/w1, sub-blocks 4-7 take 4 bits from w2 and their top 2 from w0/w1."""
    a = (w0 >> (8 * i)) & 0xFF
    b = (w1 >> (8 * i)) & 0xFF
    c = (w2 >> (8 * i)) & 0xFF
    scale = tl.where(low, a & 63, (c & 0xF) | ((a >> 6) << 4))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 6) << 4))
    return scale.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _q4_k(w8, w32, f16, base, x_ptr, xoff, b0, n_blocks, NB: tl.constexpr, X_SHARED: tl.constexpr):
    """Q4_K = fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) × 8 sub-blocks, 128 bytes of nibbles (144 bytes).
    Tile [R, C, 32]: C = NB·4 groups of 32 bytes; group g holds values 64g..64g+31 in its low nibbles (sub-block 2g)
    and 64g+32.. in its high nibbles (sub-block 2g+1). x = d·scale·q − dmin·min."""
    c = tl.arange(0, NB * 4)
    blk = b0 + c // 4
    grp = c % 4
    ok = blk < n_blocks
    blk = tl.minimum(blk, n_blocks - 1)
    lane = tl.arange(0, 32)
    boff = base[:, None] + blk[None, :] * 144  # [R, C]
    q = tl.load(w8 + boff[:, :, None] + 16 + grp[None, :, None] * 32 + lane[None, None, :]).to(tl.int32)
    idx = (blk * 256 + grp * 64)[:, None] + lane[None, :]
    x_lo = _x(x_ptr, xoff, idx, ok, X_SHARED)
    x_hi = _x(x_ptr, xoff, idx + 32, ok, X_SHARED)
    dot_lo = tl.sum(_float(q & 0xF, 0.0) * x_lo, axis=2)
    dot_hi = tl.sum(_float(q >> 4, 0.0) * x_hi, axis=2)
    word = boff // 4  # blocks are 4-byte aligned: 144 = 4·36
    w0 = tl.load(w32 + word + 1)
    w1 = tl.load(w32 + word + 2)
    w2 = tl.load(w32 + word + 3)
    low = (grp < 2)[None, :]
    first = (2 * (grp % 2))[None, :]
    sc_lo, mn_lo = _q4_k_scale(w0, w1, w2, first, low)
    sc_hi, mn_hi = _q4_k_scale(w0, w1, w2, first + 1, low)
    d = tl.load(f16 + boff // 2).to(tl.float32)
    dmin = tl.load(f16 + boff // 2 + 1).to(tl.float32)
    part = d * (sc_lo * dot_lo + sc_hi * dot_hi) - dmin * (mn_lo * tl.sum(x_lo, axis=2) + mn_hi * tl.sum(x_hi, axis=2))
    return tl.sum(part, axis=1)


@triton.jit
def _q6_k(w16, i8, f16, base, x_ptr, xoff, b0, n_blocks, NB: tl.constexpr, X_SHARED: tl.constexpr):
    """Q6_K = 128 bytes of low nibbles (ql), 64 bytes of 2-bit highs (qh), 16 int8 scales, fp16 d (210 bytes).
    Value 128n + 32j + l (half n, quarter j, l < 32): low nibble of ql[64n + 32(j mod 2) + l] (the high nibble for
    j ≥ 2), bits 2j of qh[32n + l], scale sc[8n + 2j + l // 16]; x = d·scale·(q − 32). Tile [R, C, 8]: C = NB·4
    (block, n, l // 16); each step reads int16 pairs (e = 0, 1) of 16 consecutive l (blocks are 2-byte aligned)."""
    c = tl.arange(0, NB * 4)
    blk = b0 + c // 4
    half = (c // 2) % 2
    sixteen = c % 2
    ok = blk < n_blocks
    blk = tl.minimum(blk, n_blocks - 1)
    j = tl.arange(0, 8)
    boff = base[:, None] + blk[None, :] * 210  # [R, C]
    low_at = (boff + (64 * half + 16 * sixteen)[None, :]) // 2  # int16 index of ql[64n + 16·(l//16)]
    high_at = (boff + (128 + 32 * half + 16 * sixteen)[None, :]) // 2
    ql_a = tl.load(w16 + low_at[:, :, None] + j[None, None, :]).to(tl.int32)  # quarters 0 (low) and 2 (high)
    ql_b = tl.load(w16 + low_at[:, :, None] + 16 + j[None, None, :]).to(tl.int32)  # quarters 1 and 3
    qh = tl.load(w16 + high_at[:, :, None] + j[None, None, :]).to(tl.int32)
    first = (blk * 256 + 128 * half + 16 * sixteen)[:, None] + 2 * j[None, :]  # x index of quarter 0, e = 0
    scale_at = boff + (192 + 8 * half + sixteen)[None, :]
    part = tl.zeros(boff.shape, dtype=tl.float32)
    for quarter in tl.static_range(4):
        src = ql_a if quarter % 2 == 0 else ql_b
        dot = tl.zeros(boff.shape, dtype=tl.float32)
        for e in tl.static_range(2):
            nib = (src >> (8 * e + 4 * (quarter // 2))) & 0xF
            hi = (qh >> (8 * e + 2 * quarter)) & 3
            x = _x(x_ptr, xoff, first + 32 * quarter + e, ok, X_SHARED)
            dot += tl.sum(_float(nib | (hi << 4), 32.0) * x, axis=2)
        part += tl.load(i8 + scale_at + 2 * quarter).to(tl.float32) * dot
    d = tl.load(f16 + (boff + 208) // 2).to(tl.float32)
    return tl.sum(d * part, axis=1)


@triton.jit
def _rows_dot(w8, w16, w32, i8, f16, base, x_ptr, xoff, n_blocks, QTYPE: tl.constexpr, R: tl.constexpr,
              NB: tl.constexpr, X_SHARED: tl.constexpr):
    """Σ_k W[row, k]·x[k] for the R rows starting at byte offsets base."""
    acc = tl.zeros([R], dtype=tl.float32)
    for b0 in range(0, n_blocks, NB):
        if QTYPE == 0:
            acc += _q8_0(w16, f16, base, x_ptr, xoff, b0, n_blocks, NB, X_SHARED)
        elif QTYPE == 1:
            acc += _q4_k(w8, w32, f16, base, x_ptr, xoff, b0, n_blocks, NB, X_SHARED)
        else:
            acc += _q6_k(w16, i8, f16, base, x_ptr, xoff, b0, n_blocks, NB, X_SHARED)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, x_stride, w8, w16, w32, i8, f16, v8, v16, v32, vi8, vf16, ids_ptr, coef_ptr, out_ptr,
                 out_stride, N, n_items, row_bytes, n_blocks, QTYPE: tl.constexpr, BN: tl.constexpr,
                 AP: tl.constexpr, NB: tl.constexpr, HAS_IDS: tl.constexpr, REDUCE: tl.constexpr,
                 GLU: tl.constexpr, X_SHARED: tl.constexpr):
    """Program p computes output rows p·BN .. p·BN+BN−1 of every item: R = AP·BN virtual rows (item, row).
    Item a reads matrix ids[a] of the stack (0 without ids) and x row a (x_stride = 0: one x for all). REDUCE sums
    the items under coef into output row 0; GLU (second stack v*) writes SiLU(W·x) ⊙ (V·x)."""
    pid = tl.program_id(0)
    r = tl.arange(0, AP * BN)
    item = r // BN
    n = pid * BN + r % BN
    real = item < n_items  # AP pads the items to a power of two
    live = real & (n < N)
    item = tl.minimum(item, n_items - 1)
    if HAS_IDS:
        matrix = tl.load(ids_ptr + item).to(tl.int64)
    else:
        matrix = tl.zeros([AP * BN], dtype=tl.int64)
    base = (matrix * N + tl.minimum(n, N - 1)) * row_bytes  # [R] byte offset of each virtual row
    xoff = item.to(tl.int64) * x_stride
    acc = _rows_dot(w8, w16, w32, i8, f16, base, x_ptr, xoff, n_blocks, QTYPE, AP * BN, NB, X_SHARED)
    if GLU:
        up = _rows_dot(v8, v16, v32, vi8, vf16, base, x_ptr, xoff, n_blocks, QTYPE, AP * BN, NB, X_SHARED)
        acc = acc * tl.sigmoid(acc) * up
    if REDUCE:
        coef = tl.load(coef_ptr + item, mask=real, other=0.0).to(tl.float32)
        total = tl.sum(tl.reshape(acc * coef, (AP, BN)), axis=0)
        cols = pid * BN + tl.arange(0, BN)
        tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=cols < N)
    else:
        tl.store(out_ptr + item * out_stride + n, acc.to(out_ptr.dtype.element_ty), mask=live)


@dataclass(frozen=True)
class GemvConfig:
    """BN output rows per program (of every item), NB blocks of each row decoded per loop step, warps."""

    rows: int
    blocks: int
    warps: int = 4


# Row-blocks a program decodes per step: ~4-7 KB of weights in flight (Q8_0 blocks are 34 bytes, K blocks 144-210).
_STEP_ROW_BLOCKS = {"Q8_0": 128, "Q4_K": 32, "Q6_K": 32}
_MAX_STEP_BLOCKS = {"Q8_0": 8, "Q4_K": 2, "Q6_K": 2}
_TARGET_PROGRAMS = 264  # two per multiprocessor of an H100 (132): fewer leaves the chip idle
# Q4_K single matrices (no stack of items), from the tilings timed on an H100 inside CUDA graphs
# (benchmarks/results/refengine-h100.md, gemv part): 4 rows × 4 blocks a step beat 16 × 2 by 16-28% on the 35B-A3B
# projections (4096-8192 rows); the 248320-row output matrix is fastest with 32 rows × 1 block on 2 warps (13%).
# The 8 routed experts' gate+up (GLU) of a decode step: 1 row × 4 blocks on 8 warps beat 1 × 2 on 4 by 15%.
_SINGLE_Q4_K = GemvConfig(4, 4)
_MANY_ROWS, _MANY_ROWS_Q4_K = 65536, GemvConfig(32, 1, 2)
_STACKED_GLU_Q4_K = GemvConfig(1, 4, 8)


def default_config(qtype: str, n_rows: int, n_blocks: int, items: int, glu: bool = False,
                   on_gpu: bool = True) -> GemvConfig:
    """Enough row-blocks per step to keep loads in flight, and rows per program cut down until the grid has ~2
    programs per multiprocessor (matrices of few rows get one row per program); Q4_K single matrices take the
    measured tilings above. The interpreter (CPU tests) runs programs one by one, each at a fixed cost: there, few
    programs of many rows."""
    ap = triton.next_power_of_2(items)
    nb = min(triton.next_power_of_2(n_blocks), _MAX_STEP_BLOCKS[qtype])
    if not on_gpu:
        return GemvConfig(min(triton.next_power_of_2(n_rows), max(1, 256 // ap)), nb)
    if qtype == "Q4_K" and items > 1 and glu:
        return GemvConfig(1, min(triton.next_power_of_2(n_blocks), _STACKED_GLU_Q4_K.blocks), _STACKED_GLU_Q4_K.warps)
    if qtype == "Q4_K" and items == 1:
        if n_rows >= _MANY_ROWS:
            return _MANY_ROWS_Q4_K
        nb = min(triton.next_power_of_2(n_blocks), _SINGLE_Q4_K.blocks)
        rows = max(1, _SINGLE_Q4_K.rows * _SINGLE_Q4_K.blocks // (nb * (2 if glu else 1)))
    else:
        rows = max(1, _STEP_ROW_BLOCKS[qtype] // (nb * ap * (2 if glu else 1)))
    while rows > 1 and triton.cdiv(n_rows, rows) < _TARGET_PROGRAMS:
        rows //= 2
    return GemvConfig(rows, nb)


def _views(w: QuantWeight) -> tuple[torch.Tensor, ...]:
    """The raw blocks as uint8, int16, int32 (Q4_K only: its blocks are 4-byte aligned), int8 and fp16: each
    kernel reads every field at its width."""
    flat = w.raw.contiguous().view(-1)
    words = flat.view(torch.int32) if w.qtype == "Q4_K" else flat
    return flat, flat.view(torch.int16), words, flat.view(torch.int8), flat.view(torch.float16)


def qgemv(x: torch.Tensor, w: QuantWeight, ids: torch.Tensor | None = None, coef: torch.Tensor | None = None,
          out_dtype: torch.dtype | None = None, up: QuantWeight | None = None,
          config: GemvConfig | None = None) -> torch.Tensor:
    """x [A, K]; w [N, K] or stacked [R, N, K]. Without ids: A independent products → [A, N]. With ids [A] (matrices
    of the stack, on the device): item a uses W[ids[a]] and x[a] (or x[0] when x has one row); with coef [A] the A
    products are summed under those weights → [1, N]. With `up` (same shape and type as w): SiLU(W·x) ⊙ (U·x)."""
    N, K = w.shape[-2:]
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {K}")
    if up is not None and (up.shape != w.shape or up.qtype != w.qtype):
        raise ValueError("gate and up weights must have the same shape and type")
    items = ids.shape[0] if ids is not None else x.shape[0]
    x = x.contiguous()
    shared = x.shape[0] == 1
    reduce = coef is not None
    out = torch.empty((1 if reduce else items, N), dtype=out_dtype or x.dtype, device=x.device)
    cfg = config or default_config(w.qtype, N, w.blocks_per_row, items, up is not None, x.is_cuda)
    views = _views(w)
    up_views = _views(up) if up is not None else views
    _gemv_kernel[(triton.cdiv(N, cfg.rows),)](
        x, 0 if shared else K, *views, *up_views, ids if ids is not None else views[0],
        coef if reduce else views[0], out, N, N, items, w.raw.shape[-1], w.blocks_per_row,
        QTYPE=_QTYPE_ID[w.qtype], BN=cfg.rows, AP=triton.next_power_of_2(items), NB=cfg.blocks,
        HAS_IDS=ids is not None, REDUCE=reduce, GLU=up is not None, X_SHARED=shared, num_warps=cfg.warps)
    return out
