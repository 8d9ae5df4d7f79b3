"""One decode step of gated attention in torch: the definition (model.attention for one token) the kernels are held to."""

from __future__ import annotations

import math

import torch

from autoinfer.refengine.ops.norm.naive import rms_norm


def rope(x: torch.Tensor, position: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """NeoX rotary embedding on the first 2·len(inv_freq) dims of each head; x [heads, D] fp32."""
    angles = position.double() * inv_freq
    cos, sin = angles.cos().float(), angles.sin().float()
    half = inv_freq.numel()
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def attention_decode(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor,
                     inv_freq: torch.Tensor, eps: float, cache_k: torch.Tensor, cache_v: torch.Tensor,
                     position: torch.Tensor) -> torch.Tensor:
    Hkv, _, D = cache_k.shape
    H = qg.shape[-1] // (2 * D)
    qg = qg.view(H, 2 * D)
    q = rope(rms_norm(qg[:, :D], q_norm, eps), position, inv_freq)
    k = rope(rms_norm(k.view(Hkv, D), k_norm, eps), position, inv_freq)
    cache_k[:, position] = k.to(cache_k.dtype)[:, None]
    cache_v[:, position] = v.view(Hkv, D).to(cache_v.dtype)[:, None]
    n = int(position) + 1
    keys, values = cache_k[:, :n].float(), cache_v[:, :n].float()  # [Hkv, n, D]
    rep = H // Hkv
    scores = (q.view(Hkv, rep, D) @ keys.transpose(1, 2)) / math.sqrt(D)  # [Hkv, rep, n]
    out = (scores.softmax(-1) @ values).view(H, D)
    return (out * torch.sigmoid(qg[:, D:].float())).reshape(1, H * D).to(cache_v.dtype)
