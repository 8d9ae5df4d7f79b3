"""A decode step's routing in two Triton kernels instead of ~12 torch launches.

1. `_logits_kernel`: the n_experts router rows and the shared expert's gate vector as one product of n_experts + 1
   rows with the token (fp32, rows split over many programs: the router is 2 MiB on a 35B-A3B layer).
2. `_topk_kernel`: one program per token takes the k largest logits by k rounds of argmax (descending, as topk),
   their softmax renormalised over the k (the full softmax's normaliser cancels: p_i / Σ_top p = e^(l_i − m) /
   Σ_top e^(l_j − m)), and σ of the gate logit.

Several tokens (a prefill) keep the torch path: its matmul reads the router once for all of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device
from autoinfer.refengine.ops.route.naive import route


@triton.jit
def _logits_kernel(x_ptr, router_ptr, gate_ptr, out_ptr, N, E, BN: tl.constexpr, BE: tl.constexpr):
    """out[n] = W[n] · x for the BN rows n of this program; row N is the gate vector."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BE], dtype=tl.float32)
    for e0 in range(0, E, BE):
        cols = e0 + tl.arange(0, BE)
        ok = cols < E
        x = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(router_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * E + cols[None, :],
                    mask=(rows < N)[:, None] & ok[None, :], other=0.0)
        g = tl.load(gate_ptr + cols, mask=ok, other=0.0)
        w = tl.where((rows == N)[:, None], g[None, :], w)
        acc += w * x[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=rows <= N)


@triton.jit
def _topk_kernel(logits_ptr, expert_ptr, weight_ptr, gate_ptr, N, K: tl.constexpr, KP: tl.constexpr,
                 BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    logits = tl.load(logits_ptr + cols, mask=cols < N, other=float("-inf"))
    top = tl.max(logits, axis=0)
    ks = tl.arange(0, KP)
    chosen = tl.zeros([KP], dtype=tl.int64)
    probs = tl.zeros([KP], dtype=tl.float32)
    for i in tl.static_range(K):
        m = tl.max(logits, axis=0)
        pick = tl.min(tl.where(logits == m, cols, BLOCK), axis=0)  # the lowest index among equal values
        chosen = tl.where(ks == i, pick.to(tl.int64), chosen)
        probs = tl.where(ks == i, tl.exp(m - top), probs)
        logits = tl.where(cols == pick, float("-inf"), logits)
    tl.store(expert_ptr + ks, chosen, mask=ks < K)
    tl.store(weight_ptr + ks, probs / tl.sum(probs, axis=0), mask=ks < K)
    g = tl.load(logits_ptr + N)
    tl.store(gate_ptr, 1.0 / (1.0 + tl.exp(-g)))


def triton_route(x: torch.Tensor, router: torch.Tensor, shared_gate: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.shape[0] != 1:
        return route(x, router, shared_gate, k)
    check_device(x.device)
    N, E = router.shape
    logits = torch.empty(N + 1, dtype=torch.float32, device=x.device)
    expert = torch.empty(1, k, dtype=torch.int64, device=x.device)
    weight = torch.empty(1, k, dtype=torch.float32, device=x.device)
    gate = torch.empty(1, dtype=torch.float32, device=x.device)
    bn = 2 if x.is_cuda else 64  # ~130 programs on the GPU; few (each costs) in the interpreter
    _logits_kernel[(triton.cdiv(N + 1, bn),)](x.contiguous(), router, shared_gate, logits, N, E, BN=bn, BE=512)
    _topk_kernel[(1,)](logits, expert, weight, gate, N, K=k, KP=triton.next_power_of_2(k), BLOCK=triton.next_power_of_2(N))
    return expert, weight, gate
