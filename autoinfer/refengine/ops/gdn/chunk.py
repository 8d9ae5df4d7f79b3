"""The gated delta rule in chunks of 64 tokens: the sequential scan runs once per chunk instead of once per token.

Inside a chunk (positions 1..C, cumulative log decay γ_t = Σ_{s≤t} g_s, Γ = e^γ) the C delta-rule updates collapse
into one unit-lower-triangular system (the WY/UT form of DeltaNet):
    (I + A) [U | W] = [β⊙V | β⊙Γ⊙K],   A_ij = β_i (k_i·k_j) e^{γ_i−γ_j}  for j < i, else 0.
With S the state entering the chunk, the corrected values are V' = U − W S, and
    O = (Q⊙Γ) S + ((Q Kᵀ) ⊙ M) V',       M_ij = e^{γ_i−γ_j} for j ≤ i, else 0,
    S ← Γ_C S + (K ⊙ e^{γ_C−γ})ᵀ V'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, state: torch.Tensor, chunk: int = CHUNK
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    T, H, _ = q.shape
    chunk = min(chunk, T)  # a short input (a decode step) is one chunk of its own length: the same math
    pad = (-T) % chunk
    # [H, n_chunks, C, d]; padded positions have k = v = 0 and g = 0, so they change nothing.
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(0, 1).reshape(H, -1, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)).transpose(0, 1).reshape(H, -1, chunk) for x in (g, beta))

    gamma = g.cumsum(-1)  # [H, N, C]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # M, [H,N,C,C]

    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    system = A.tril(-1) + eye
    rhs = torch.cat([v * beta[..., None], kb * gamma.exp()[..., None]], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    U, W = solved.split([v.shape[-1], k.shape[-1]], dim=-1)

    intra = (q @ k.transpose(-1, -2)) * decay  # [H, N, C, C]
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    chunk_decay = gamma[..., -1].exp()  # [H, N]

    S = state.clone()
    out = torch.empty_like(U)
    for n in range(q.shape[1]):
        v_new = U[:, n] - W[:, n] @ S
        out[:, n] = q_decayed[:, n] @ S + intra[:, n] @ v_new
        S = S * chunk_decay[:, n, None, None] + k_to_end[:, n].transpose(-1, -2) @ v_new
    out = out.reshape(H, -1, out.shape[-1])[:, :T].transpose(0, 1)
    return out.contiguous(), S
