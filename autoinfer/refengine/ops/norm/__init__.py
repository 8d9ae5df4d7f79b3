"""RMSNorm variants, selectable by name (`norm` knob). All share one signature:

    fn(x, weight, eps, dtype, gate=None) -> x / rms(x) · weight [· SiLU(gate)]   in `dtype`

over the last dimension of x (weight has that length), computed in fp32. `torch` is the reference (a composition
of ~8 elementwise kernels); `triton` is one kernel, which matters where a decode step is hundreds of tiny launches.
"""

from __future__ import annotations

from typing import Callable

import torch

from autoinfer.refengine.ops.norm.naive import rms_norm
from autoinfer.refengine.ops.norm.triton_norm import triton_rms_norm
from autoinfer.refengine.ops.variants import pick

NormFn = Callable[..., torch.Tensor]

VARIANTS: dict[str, NormFn] = {"torch": rms_norm, "triton": triton_rms_norm}
REFERENCE = "torch"
TRITON = {"triton"}


def get(name: str) -> NormFn:
    return pick("norm", VARIANTS, name)
