"""MoE routing as torch operations: the definition, and the reference the kernels are held to."""

from __future__ import annotations

import torch


def route(x: torch.Tensor, router: torch.Tensor, shared_gate: torch.Tensor,
          k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    xf = x.float()
    probs = (xf @ router.T).softmax(-1)
    top, expert = probs.topk(k, dim=-1)
    return expert, top / top.sum(-1, keepdim=True), torch.sigmoid(xf @ shared_gate)
