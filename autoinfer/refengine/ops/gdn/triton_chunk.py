"""The chunked gated delta rule (ops/gdn/chunk.py's maths) as three Triton kernels, for prefill.

1. `_prepare_kernel`, one program per (chunk, head), all in parallel: γ = cumsum(g) inside the chunk,
   A_ij = β_i (k_i·k_j) e^{γ_i−γ_j} (j < i), T = (I + A)⁻¹ by forward substitution on the 64 × 64 tile in
   registers, then W = T (β⊙Γ⊙K) and U = T (β⊙V) with tensor-core products.
2. `_state_kernel`, one program per (head, slice of value columns), walking the chunks in order with the state
   slice in registers: V' = U − W S;  S ← Γ_C S + (K ⊙ e^{γ_C−γ})ᵀ V'. It keeps the state entering each chunk.
3. `_output_kernel`, one program per (chunk, head, value slice), in parallel: O = (Q⊙Γ) S_n + ((Q Kᵀ) ⊙ M) V'.

Same signature as ops/gdn/naive.py (everything fp32): fn(q, k, v, g, beta, state) -> (out, new_state). Products
take fp32 operands in TF32 on the GPU (about 1e-3 relative error; the naive recurrence is the reference the tests
hold it to), exact fp32 under TRITON_INTERPRET=1. flash-linear-attention's chunk_gated_delta_rule does the same
work in more, finer kernels (benchmarks/refengine_bench.py compares the two on the model's shapes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.gdn.fused_recurrent import fused_recurrent_gated_delta_rule
from autoinfer.refengine.ops.quant.kernels import check_device

CHUNK = 64


@triton.jit
def _prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, gamma_ptr, T, H, DK: tl.constexpr,
                    DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr):
    n, h = tl.program_id(0), tl.program_id(1)
    t = n * C + tl.arange(0, C)
    live = t < T
    row = t.to(tl.int64) * H + h  # [C] index of (token, head); padded tokens (t ≥ T) have k = v = g = β = 0
    g = tl.load(g_ptr + row, mask=live, other=0.0)
    beta = tl.load(beta_ptr + row, mask=live, other=0.0)
    gamma = tl.cumsum(g, axis=0)
    tl.store(gamma_ptr + row, gamma)  # scratch is padded to whole chunks
    i = tl.arange(0, C)[:, None]
    j = tl.arange(0, C)[None, :]
    dims = tl.arange(0, BK)
    kk = tl.zeros([C, C], dtype=tl.float32)
    for k0 in tl.static_range(0, DK, BK):
        kb = tl.load(k_ptr + row[:, None] * DK + k0 + dims[None, :], mask=live[:, None], other=0.0)
        kk += tl.dot(kb, tl.trans(kb))
    lower = j < i
    A = tl.where(lower, beta[:, None] * kk * tl.exp(tl.where(lower, gamma[:, None] - gamma[None, :], 0.0)), 0.0)
    # T = (I + A)⁻¹: row r of T is e_r − Σ_{j<r} A_rj T_j, and rows j < r are final when row r is computed.
    inv = tl.where(i == j, 1.0, 0.0)
    for r in range(1, C):
        a_r = tl.sum(tl.where(i == r, A, 0.0), axis=0)  # row r of A, along the columns
        combo = tl.sum(a_r[:, None] * inv, axis=0)  # Σ_j A_rj T_j
        inv = tl.where(i == r, inv - combo[None, :], inv)
    decay_beta = beta * tl.exp(gamma)
    for k0 in tl.static_range(0, DK, BK):
        kb = tl.load(k_ptr + row[:, None] * DK + k0 + dims[None, :], mask=live[:, None], other=0.0)
        tl.store(w_ptr + row[:, None] * DK + k0 + dims[None, :], tl.dot(inv, kb * decay_beta[:, None]))
    for v0 in tl.static_range(0, DV, BK):
        vb = tl.load(v_ptr + row[:, None] * DV + v0 + dims[None, :], mask=live[:, None], other=0.0)
        tl.store(u_ptr + row[:, None] * DV + v0 + dims[None, :], tl.dot(inv, vb * beta[:, None]))


@triton.jit
def _state_kernel(w_ptr, u_ptr, k_ptr, gamma_ptr, s_in, s_out, h_ptr, vnew_ptr, T, H, n_chunks, DK: tl.constexpr,
                  DV: tl.constexpr, C: tl.constexpr, BV: tl.constexpr):
    """The sequential part, as little as possible: per chunk V' = U − W S, then S ← Γ_C S + Kᵀ (e^{γ_C−γ} ⊙ V').
    Stores the state entering each chunk (h) and V' for the output kernel. The state slice is kept as two halves
    of dk rows (S_a, S_b) so that no [C, dk] tile is ever whole in registers."""
    h, pv = tl.program_id(0), tl.program_id(1)
    HALF: tl.constexpr = DK // 2
    da = tl.arange(0, HALF)
    vv = pv * BV + tl.arange(0, BV)
    s_offs = h * DK * DV + da[:, None] * DV + vv[None, :]
    S_a = tl.load(s_in + s_offs)
    S_b = tl.load(s_in + s_offs + HALF * DV)
    for n in range(0, n_chunks):
        t = n * C + tl.arange(0, C)
        live = t < T
        row = t.to(tl.int64) * H + h
        h_offs = (n * H).to(tl.int64) * DK * DV + s_offs
        tl.store(h_ptr + h_offs, S_a)
        tl.store(h_ptr + h_offs + HALF * DV, S_b)
        at = row[:, None] * DK + da[None, :]  # [C, HALF]: the first half of each row; + HALF the second
        v_new = tl.load(u_ptr + row[:, None] * DV + vv[None, :])
        v_new -= tl.dot(tl.load(w_ptr + at), S_a)
        v_new -= tl.dot(tl.load(w_ptr + at + HALF), S_b)
        tl.store(vnew_ptr + row[:, None] * DV + vv[None, :], v_new)
        gamma = tl.load(gamma_ptr + row)
        last = tl.load(gamma_ptr + (n * C + C - 1) * H + h)
        v_end = v_new * tl.exp(last - gamma)[:, None]  # decays scale the small [C, BV] tile, not K
        k = tl.load(k_ptr + at, mask=live[:, None], other=0.0)
        S_a = S_a * tl.exp(last) + tl.dot(tl.trans(k), v_end)
        k = tl.load(k_ptr + at + HALF, mask=live[:, None], other=0.0)
        S_b = S_b * tl.exp(last) + tl.dot(tl.trans(k), v_end)
    tl.store(s_out + s_offs, S_a)
    tl.store(s_out + s_offs + HALF * DV, S_b)


@triton.jit
def _output_kernel(q_ptr, k_ptr, gamma_ptr, h_ptr, vnew_ptr, out_ptr, T, H, DK: tl.constexpr, DV: tl.constexpr,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """O = (Q S_n) ⊙ e^γ + ((Q Kᵀ) ⊙ M) V' for one chunk, head and slice of value columns, all in parallel."""
    n, h, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = n * C + tl.arange(0, C)
    live = t < T
    row = t.to(tl.int64) * H + h
    dims = tl.arange(0, BK)
    vv = pv * BV + tl.arange(0, BV)
    qs = tl.zeros([C, BV], dtype=tl.float32)
    scores = tl.zeros([C, C], dtype=tl.float32)
    for k0 in tl.static_range(0, DK, BK):
        q = tl.load(q_ptr + row[:, None] * DK + k0 + dims[None, :], mask=live[:, None], other=0.0)
        k = tl.load(k_ptr + row[:, None] * DK + k0 + dims[None, :], mask=live[:, None], other=0.0)
        scores += tl.dot(q, tl.trans(k))
        state = tl.load(h_ptr + (n * H + h).to(tl.int64) * DK * DV + (k0 + dims)[:, None] * DV + vv[None, :])
        qs += tl.dot(q, state)
    gamma = tl.load(gamma_ptr + row)
    i = tl.arange(0, C)[:, None]
    j = tl.arange(0, C)[None, :]
    causal = j <= i
    scores = tl.where(causal, scores * tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :], 0.0)), 0.0)
    v_new = tl.load(vnew_ptr + row[:, None] * DV + vv[None, :])
    out = qs * tl.exp(gamma)[:, None] + tl.dot(scores, v_new)
    tl.store(out_ptr + row[:, None] * DV + vv[None, :], out, mask=live[:, None])


def triton_chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                  beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A single token (a decode step) is one step of the recurrence: the fused recurrent kernel, one launch."""
    check_device(q.device)
    T, H, dk = q.shape
    if T == 1:
        return fused_recurrent_gated_delta_rule(q, k, v, g, beta, state)
    dv = v.shape[-1]
    if dk % 16 or dv % 16 or dk & (dk - 1) or dv & (dv - 1):
        raise ValueError(f"triton_chunk needs power-of-two head dims ≥ 16 (got dk={dk}, dv={dv})")
    q, k, v, g, beta, state = (t.float().contiguous() for t in (q, k, v, g, beta, state))
    n_chunks = triton.cdiv(T, CHUNK)
    padded = n_chunks * CHUNK
    w = torch.empty(padded, H, dk, dtype=torch.float32, device=q.device)
    u = torch.empty(padded, H, dv, dtype=torch.float32, device=q.device)
    gamma = torch.empty(padded, H, dtype=torch.float32, device=q.device)
    block = min(64, dk, dv)
    _prepare_kernel[(n_chunks, H)](k, v, g, beta, w, u, gamma, T, H, DK=dk, DV=dv, C=CHUNK, BK=block, num_warps=4)
    new_state = torch.empty_like(state)
    states = torch.empty(n_chunks, H, dk, dv, dtype=torch.float32, device=q.device)  # entering each chunk
    v_new = torch.empty_like(u)
    bv = min(32, dv)
    _state_kernel[(H, dv // bv)](w, u, k, gamma, state, new_state, states, v_new, T, H, n_chunks, DK=dk, DV=dv,
                                 C=CHUNK, BV=bv, num_warps=4, num_stages=1)
    out = torch.empty_like(v)
    bv = min(64, dv)
    _output_kernel[(n_chunks, H, dv // bv)](q, k, gamma, states, v_new, out, T, H, DK=dk, DV=dv, C=CHUNK, BK=block,
                                            BV=bv, num_warps=4, num_stages=2)
    return out, new_state
