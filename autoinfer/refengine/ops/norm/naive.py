"""RMSNorm as torch operations: the definition, and the reference the kernel is held to."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype = torch.float32,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight
    if gate is not None:
        y = y * F.silu(gate.float())
    return y.to(dtype)


def add_rms_norm(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float,
                 dtype: torch.dtype = torch.float32, shared: torch.Tensor | None = None,
                 gate: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual step and the next norm: h = x + u in x's dtype, u = update [+ gate[:, None] · shared] formed in
    fp32 and rounded once to x's dtype; returns (h, RMSNorm(h) in dtype)."""
    u = update.float()
    if shared is not None:
        u = u + gate[:, None] * shared.float()
    h = x + u.to(x.dtype)
    return h, rms_norm(h, weight, eps, dtype)
