"""The gated delta rule as one Triton kernel: each program keeps a [dk, BV] slice of one head's state in registers
and walks the tokens, doing decay, delta-rule update and output per token with no trip through memory. For a
decode step (T = 1) the whole layer's recurrence is one launch reading and writing the state once; for prefill it
is a sequential scan (ops/gdn/chunk.py is the parallel form).

Same signature and maths as ops/gdn/naive.py: S ← e^g·S;  δ = β·(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq.
Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device, interpreted


@triton.jit
def _fused_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_in, s_out, out_ptr, T, H,
                            DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    h, pid_v = tl.program_id(0), tl.program_id(1)
    kk = tl.arange(0, BK)
    vv = pid_v * BV + tl.arange(0, BV)
    k_ok, v_ok = kk < DK, vv < DV
    s_mask = k_ok[:, None] & v_ok[None, :]
    s_offs = h * DK * DV + kk[:, None] * DV + vv[None, :]
    S = tl.load(s_in + s_offs, mask=s_mask, other=0.0)
    for t in range(0, T):
        row = t * H + h
        k = tl.load(k_ptr + row * DK + kk, mask=k_ok, other=0.0)
        q = tl.load(q_ptr + row * DK + kk, mask=k_ok, other=0.0)
        v = tl.load(v_ptr + row * DV + vv, mask=v_ok, other=0.0)
        decay = tl.exp(tl.load(g_ptr + row))
        beta = tl.load(beta_ptr + row)
        S = S * decay
        delta = beta * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * delta[None, :]
        tl.store(out_ptr + row * DV + vv, tl.sum(S * q[:, None], axis=0), mask=v_ok)
    tl.store(s_out + s_offs, S, mask=s_mask)


def fused_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                     beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_device(q.device)
    T, H, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta, state = (t.float().contiguous() for t in (q, k, v, g, beta, state))
    out = torch.empty_like(v)
    new_state = torch.empty_like(state)
    # Slices of 32 value columns spread a head over several programs; the interpreter runs one program a head.
    BV = triton.next_power_of_2(dv) if interpreted() else min(32, triton.next_power_of_2(dv))
    _fused_recurrent_kernel[(H, triton.cdiv(dv, BV))](q, k, v, g, beta, state, new_state, out, T, H, DK=dk, DV=dv,
                                                      BK=triton.next_power_of_2(dk), BV=BV)
    return out, new_state
