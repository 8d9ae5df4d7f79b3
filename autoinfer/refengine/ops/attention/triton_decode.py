"""One decode step of gated attention in three Triton launches instead of ~40 torch ones (flash-decoding):

1. `_qk_kernel`, one program per query or key head: RMSNorm of the head with its weight, NeoX rotary at the
   position (angles in fp64, as the torch path), q kept in fp32; k and v written into the caches at the position.
2. `_split_kernel`, one program per (query head, slice of the cache): online softmax over its positions ≤ the
   position (a dynamic bound read on the device), giving the slice's running max, normaliser and weighted sum.
3. `_combine_kernel`, one program per query head: the slices merged, then the output gate σ(g).

Query head h reads key/value head h // (H / Hkv), as the torch path's grouping.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device


@triton.jit
def _qk_kernel(qg_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, freq_ptr, pos_ptr, q_out, ck_ptr, cv_ptr, H, cap, eps,
               D: tl.constexpr, HALF: tl.constexpr):
    r = tl.program_id(0)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, D)
    is_q = r < H
    j = r - H  # the key head of programs r ≥ H
    src = tl.where(is_q, qg_ptr + r * 2 * D, k_ptr + j * D)
    norm_w = tl.where(is_q, qn_ptr, kn_ptr)
    raw = tl.load(src + d).to(tl.float32)
    inv = tl.rsqrt(tl.sum(raw * raw, axis=0) / D + eps)
    x = raw * inv * tl.load(norm_w + d)
    # rotary: dim i < HALF pairs with i + HALF (x_i cos − x_{i+HALF} sin; x_{i+HALF} cos + x_i sin); dims ≥ 2·HALF pass
    low = d < HALF
    partner_at = tl.where(low, d + HALF, d - HALF)
    rot = d < 2 * HALF
    partner = tl.load(src + partner_at, mask=rot, other=0.0).to(tl.float32) * inv * tl.load(norm_w + partner_at,
                                                                                          mask=rot, other=0.0)
    angle = pos.to(tl.float64) * tl.load(freq_ptr + tl.where(low, d, d - HALF), mask=rot, other=0.0)
    cos, sin = tl.cos(angle).to(tl.float32), tl.sin(angle).to(tl.float32)
    y = tl.where(rot, x * cos + tl.where(low, -partner, partner) * sin, x)
    if is_q:
        tl.store(q_out + r * D + d, y)
    else:
        at = (j.to(tl.int64) * cap + pos) * D + d
        tl.store(ck_ptr + at, y.to(ck_ptr.dtype.element_ty))
        tl.store(cv_ptr + at, tl.load(v_ptr + j * D + d).to(cv_ptr.dtype.element_ty))


@triton.jit
def _split_kernel(q_ptr, ck_ptr, cv_ptr, pos_ptr, part_ptr, cap, chunk, scale, REP: tl.constexpr, D: tl.constexpr,
                  BS: tl.constexpr, SPLITS: tl.constexpr):
    h, c = tl.program_id(0), tl.program_id(1)
    n = tl.load(pos_ptr) + 1
    d = tl.arange(0, D)
    q = tl.load(q_ptr + h * D + d)
    base = (h // REP).to(tl.int64) * cap * D
    m = float("-inf")
    total = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    for s0 in range(c * chunk, tl.minimum(n, c * chunk + chunk), BS):
        s = s0 + tl.arange(0, BS)
        ok = s < tl.minimum(n, c * chunk + chunk)
        at = base + s[:, None].to(tl.int64) * D + d[None, :]
        keys = tl.load(ck_ptr + at, mask=ok[:, None], other=0.0).to(tl.float32)
        scores = tl.where(ok, tl.sum(keys * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        values = tl.load(cv_ptr + at, mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * values, axis=0)
        total = total * alpha + tl.sum(p, axis=0)
        m = m_new
    out = part_ptr + (h * SPLITS + c) * (D + 2)
    tl.store(out + d, acc)
    tl.store(out + D, m)
    tl.store(out + D + 1, total)


@triton.jit
def _combine_kernel(part_ptr, qg_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr):
    h = tl.program_id(0)
    c = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    rows = part_ptr + (h * SPLITS + c) * (D + 2)
    m = tl.load(rows + D)
    total = tl.load(rows + D + 1)
    top = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
    acc = tl.load(rows[:, None] + d[None, :])
    o = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * total, axis=0)
    g = tl.load(qg_ptr + h * 2 * D + D + d).to(tl.float32)
    tl.store(out_ptr + h * D + d, (o * tl.sigmoid(g)).to(out_ptr.dtype.element_ty))


def triton_attention_decode(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor,
                            k_norm: torch.Tensor, inv_freq: torch.Tensor, eps: float, cache_k: torch.Tensor,
                            cache_v: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    check_device(qg.device)
    Hkv, cap, D = cache_k.shape
    H = qg.shape[-1] // (2 * D)
    qg, k, v = qg.contiguous(), k.contiguous(), v.contiguous()
    q = torch.empty(H, D, dtype=torch.float32, device=qg.device)
    _qk_kernel[(H + Hkv,)](qg, k, v, q_norm, k_norm, inv_freq, position, q, cache_k, cache_v, H, cap, eps, D=D,
                           HALF=inv_freq.numel())
    splits = 16 if qg.is_cuda else 2
    chunk = triton.cdiv(cap, splits)
    parts = torch.empty(H, splits, D + 2, dtype=torch.float32, device=qg.device)
    _split_kernel[(H, splits)](q, cache_k, cache_v, position, parts, cap, chunk, 1.0 / math.sqrt(D), REP=H // Hkv,
                               D=D, BS=32, SPLITS=splits)
    out = torch.empty(1, H * D, dtype=cache_v.dtype, device=qg.device)
    _combine_kernel[(H,)](parts, qg, out, D=D, SPLITS=splits)
    return out
