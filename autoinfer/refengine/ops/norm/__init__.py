"""RMSNorm variants, selectable by name (`norm` knob). All share one signature:

    fn(x, weight, eps, dtype, gate=None) -> x / rms(x) · weight [· SiLU(gate)]   in `dtype`

over the last dimension of x (weight has that length), computed in fp32. `torch` is the reference (a composition
of ~8 elementwise kernels); `triton` is one kernel, which matters where a decode step is hundreds of tiny launches.
Each variant also has the residual step fused with the norm after it (ADD_VARIANTS, same names):

    fn(x, update, weight, eps, dtype, shared=None, gate=None) -> (h, RMSNorm(h))

h = x + (update [+ gate[:, None] · shared], formed in fp32, rounded to x's dtype), in x's dtype.
"""

from __future__ import annotations

from typing import Callable

import torch

from autoinfer.refengine.ops.norm.naive import add_rms_norm, rms_norm
from autoinfer.refengine.ops.norm.triton_norm import triton_add_rms_norm, triton_rms_norm
from autoinfer.refengine.ops.variants import pick

NormFn = Callable[..., torch.Tensor]

VARIANTS: dict[str, NormFn] = {"torch": rms_norm, "triton": triton_rms_norm}
ADD_VARIANTS: dict[str, NormFn] = {"torch": add_rms_norm, "triton": triton_add_rms_norm}
REFERENCE = "torch"
TRITON = {"triton"}


def get(name: str) -> NormFn:
    return pick("norm", VARIANTS, name)


def get_add(name: str) -> NormFn:
    return pick("norm", ADD_VARIANTS, name)
