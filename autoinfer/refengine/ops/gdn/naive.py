"""The gated delta rule one token at a time: the definition, and the reference every faster variant must match.

Per head, with state S [dk, dv]:  S ← e^g·S;  δ = β·(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq.
"""

from __future__ import annotations

import torch


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(v)
    S = state.clone()
    for t in range(q.shape[0]):
        S = S * g[t].exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", S, k[t])
        delta = beta[t][:, None] * (v[t] - predicted)
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return out, S
