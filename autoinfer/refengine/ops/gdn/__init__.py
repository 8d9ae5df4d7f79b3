"""Gated delta rule variants, selectable by name. All share one signature:

    fn(q, k, v, g, beta, state) -> (out, new_state)

q, k: [T, H, dk] (L2-normalised, q already scaled by 1/√dk), v: [T, H, dv], g: [T, H] log decay ≤ 0,
beta: [T, H], state: [H, dk, dv]; everything fp32. `naive` is the reference; `chunk` its chunked form in torch;
`fused_recurrent` (one token after another, the decode kernel) and `triton_chunk` (the chunked form, for prefill)
are Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1). With a Triton variant the model runs a decode step
(one token) through fused_decode.py instead: conv, norms, gates and recurrence in one kernel.
"""

from __future__ import annotations

from typing import Callable

import torch

from autoinfer.refengine.ops.gdn.chunk import chunk_gated_delta_rule
from autoinfer.refengine.ops.gdn.fused_recurrent import fused_recurrent_gated_delta_rule
from autoinfer.refengine.ops.gdn.naive import recurrent_gated_delta_rule
from autoinfer.refengine.ops.gdn.triton_chunk import triton_chunk_gated_delta_rule
from autoinfer.refengine.ops.variants import pick

GdnFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

VARIANTS: dict[str, GdnFn] = {"naive": recurrent_gated_delta_rule, "chunk": chunk_gated_delta_rule,
                               "fused_recurrent": fused_recurrent_gated_delta_rule,
                               "triton_chunk": triton_chunk_gated_delta_rule}
REFERENCE = "naive"
TRITON = {"fused_recurrent", "triton_chunk"}  # variants that need CUDA (or TRITON_INTERPRET=1)
CAPTURE_SAFE = {"naive", "fused_recurrent", "triton_chunk"}  # a decode step reads nothing back to the host


def get(name: str) -> GdnFn:
    return pick("gdn", VARIANTS, name)
