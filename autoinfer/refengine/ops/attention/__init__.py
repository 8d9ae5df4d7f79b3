"""Gated attention of one decode step: `naive` (torch, as model.attention computes it) is the reference of `triton`
(ops/attention/triton_decode.py), which the model uses for a decode step with the Triton decode kernels. Both:

    fn(qg, k, v, q_norm, k_norm, inv_freq, eps, cache_k, cache_v, position) -> out [1, H·D]

qg [1, H·2D] (per head D query then D gate values), k / v [1, Hkv·D] the projections; q_norm / k_norm [D] the
per-head RMSNorm weights; inv_freq [rope_dims / 2] fp64 (NeoX rotary on the first rope_dims of a head); position
[1] a device tensor; cache_k / cache_v [Hkv, capacity, D]: k (normed, rotated) and v are written at the position,
attention reads positions ≤ position. out = softmax(q kᵀ / √D) v ⊙ σ(gate) in cache_v's dtype.
"""

from __future__ import annotations

from autoinfer.refengine.ops.attention.naive import attention_decode
from autoinfer.refengine.ops.attention.triton_decode import triton_attention_decode

VARIANTS = {"naive": attention_decode, "triton": triton_attention_decode}
REFERENCE = "naive"
