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
