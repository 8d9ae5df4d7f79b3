"""MoE routing variants, selectable by name. All share one signature:

    fn(x, router, shared_gate, k) -> (expert, weight, gate)

x: [T, E] tokens; router: [n_experts, E] fp32; shared_gate: [E] fp32 (the shared expert's gate vector). expert
[T, k] int64: the k experts of largest router probability, in descending order; weight [T, k] fp32: their
probabilities renormalised to sum to 1; gate [T] fp32: σ(x · shared_gate), the shared expert's weight. `torch` is
the reference (router product, softmax, topk, sum, division, and the gate: ~12 launches a layer in a decode step);
`triton` does a decode step in two kernels (ops/route/triton_route.py).
"""

from __future__ import annotations

from typing import Callable

import torch

from autoinfer.refengine.ops.route.naive import route
from autoinfer.refengine.ops.route.triton_route import triton_route
from autoinfer.refengine.ops.variants import pick

RouteFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

VARIANTS: dict[str, RouteFn] = {"torch": route, "triton": triton_route}
REFERENCE = "torch"


def get(name: str) -> RouteFn:
    return pick("route", VARIANTS, name)
