"""A whole Gated DeltaNet decode step (one token) in two kernels, for the Triton GDN variants.

The torch path spends ~30 launches per layer between the projections and the recurrence (conv window, SiLU, two L2
norms, head repeats, β and decay gates); here one program per (value head, slice of value columns) does all of it
in registers: the causal conv of its q, k and v channels over the conv state and the new input, SiLU, the L2 norms
(q also scaled by 1/√dk), β = σ(b), g = a·softplus(α + dt_bias), then S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ;
o = Sᵀq, with the state slice updated in place. Value head j reads key head j mod Hk (the tiled order of
ops/gdn/__init__). Several programs read the same q/k channels' conv state, so the window moves in a second
kernel once they are all done. Matches model.gated_deltanet's torch path (tests/refengine/test_ops.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device

L2_EPS = 1e-6  # as model.L2_EPS


@triton.jit
def _conv_silu(qkv_ptr, conv_ptr, weight_ptr, channels, C, KW: tl.constexpr):
    """SiLU of the causal conv at the new token for `channels`: taps 0..KW-2 from the conv state, KW-1 the input."""
    acc = tl.load(qkv_ptr + channels).to(tl.float32) * tl.load(weight_ptr + channels * KW + KW - 1)
    for tap in tl.static_range(KW - 1):
        acc += tl.load(conv_ptr + tap * C + channels) * tl.load(weight_ptr + channels * KW + tap)
    return acc * tl.sigmoid(acc)


@triton.jit
def _decode_kernel(qkv_ptr, conv_ptr, weight_ptr, b_ptr, alpha_ptr, dt_bias_ptr, a_ptr, s_ptr, out_ptr, C, KEY,
                   Hk, scale, eps, KW: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    h, pv = tl.program_id(0), tl.program_id(1)
    key_head = h % Hk
    dk = tl.arange(0, DK)
    vv = pv * BV + tl.arange(0, BV)
    q = _conv_silu(qkv_ptr, conv_ptr, weight_ptr, key_head * DK + dk, C, KW)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + eps) * scale
    k = _conv_silu(qkv_ptr, conv_ptr, weight_ptr, KEY + key_head * DK + dk, C, KW)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)
    v = _conv_silu(qkv_ptr, conv_ptr, weight_ptr, 2 * KEY + h * DV + vv, C, KW)
    beta = tl.sigmoid(tl.load(b_ptr + h).to(tl.float32))
    pre = tl.load(alpha_ptr + h).to(tl.float32) + tl.load(dt_bias_ptr + h)
    softplus = tl.where(pre > 20.0, pre, tl.log(1.0 + tl.exp(tl.minimum(pre, 20.0))))  # torch's threshold
    decay = tl.exp(tl.load(a_ptr + h) * softplus)
    s_offs = h * DK * DV + dk[:, None] * DV + vv[None, :]
    S = tl.load(s_ptr + s_offs) * decay
    delta = beta * (v - tl.sum(S * k[:, None], axis=0))
    S = S + k[:, None] * delta[None, :]
    tl.store(out_ptr + h * DV + vv, tl.sum(S * q[:, None], axis=0))
    tl.store(s_ptr + s_offs, S)


@triton.jit
def _shift_kernel(qkv_ptr, conv_ptr, C, KW: tl.constexpr, BLOCK: tl.constexpr):
    """The conv window moves on by one token: rows 1.. of the state move up, the new input becomes the last."""
    channels = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = channels < C
    for row in tl.static_range(KW - 2):
        tl.store(conv_ptr + row * C + channels, tl.load(conv_ptr + (row + 1) * C + channels, mask=ok), mask=ok)
    tl.store(conv_ptr + (KW - 2) * C + channels, tl.load(qkv_ptr + channels, mask=ok).to(tl.float32), mask=ok)


def fused_gdn_decode(qkv: torch.Tensor, conv_state: torch.Tensor, conv_weight: torch.Tensor, b: torch.Tensor,
                     alpha: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor, state: torch.Tensor,
                     key_heads: int) -> torch.Tensor:
    """qkv [1, C] (the projection, before the conv), conv_state [KW−1, C] and state [Hv, dk, dv] fp32 (both
    updated in place), conv_weight [C, KW], b/alpha [1, Hv] projections, dt_bias/a [Hv]. Returns o [1, Hv, dv]."""
    check_device(qkv.device)
    Hv, dk, dv = state.shape
    C, KW = conv_weight.shape
    qkv = qkv.contiguous()
    out = torch.empty(1, Hv, dv, dtype=torch.float32, device=qkv.device)
    bv = min(32, dv)
    _decode_kernel[(Hv, dv // bv)](qkv, conv_state, conv_weight.contiguous(), b.contiguous(), alpha.contiguous(),
                                   dt_bias, a, state, out, C, key_heads * dk, key_heads, 1.0 / math.sqrt(dk), L2_EPS,
                                   KW=KW, DK=dk, DV=dv, BV=bv)
    block = 1024
    _shift_kernel[(triton.cdiv(C, block),)](qkv, conv_state, C, KW=KW, BLOCK=block)
    return out
