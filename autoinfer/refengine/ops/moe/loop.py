"""One token at a time, each through its own k experts: the definition, and the reference for `grouped`."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def loop_experts(x: torch.Tensor, token: torch.Tensor, row: torch.Tensor, weight: torch.Tensor, bank) -> torch.Tensor:
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in torch.unique(token).tolist():
        pick = (token == t).nonzero().squeeze(1)
        rows = row[pick]
        xt = x[t]
        h = F.silu(torch.einsum("kfe,e->kf", bank.gate[rows], xt)) * torch.einsum("kfe,e->kf", bank.up[rows], xt)
        out = torch.einsum("kef,kf->ke", bank.down[rows], h)
        y[t] = (out.float() * weight[pick, None].float()).sum(0)
    return y
