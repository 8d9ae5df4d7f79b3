"""RMSNorm (optionally times SiLU(gate), the GDN output gate) as one Triton kernel, one program per row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, gate_ptr, out_ptr, N, eps, GATED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GATED:
        z = tl.load(gate_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype = torch.float32,
                    gate: torch.Tensor | None = None) -> torch.Tensor:
    check_device(x.device)
    N = x.shape[-1]
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    g = gate.contiguous() if gate is not None else x
    _rms_norm_kernel[(x.numel() // N,)](x, weight.contiguous(), g, out, N, eps, GATED=gate is not None,
                                        BLOCK=triton.next_power_of_2(N))
    return out
