"""RMSNorm (optionally times SiLU(gate), the GDN output gate) as one Triton kernel, one program per row; and the
residual step fused with the norm after it (x + update [+ σ-gated shared expert], then RMSNorm), one launch instead
of ~6 elementwise ones."""

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


@triton.jit
def _add_rms_norm_kernel(x_ptr, u_ptr, s_ptr, g_ptr, w_ptr, h_ptr, out_ptr, N, eps, SHARED: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    u = tl.load(u_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    if SHARED:
        u += tl.load(g_ptr + row) * tl.load(s_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0)
    h = (x.to(tl.float32) + u.to(x.dtype).to(tl.float32)).to(x.dtype)  # rounded as x + u.to(x.dtype) in torch
    tl.store(h_ptr + row * N + cols, h, mask=ok)
    hf = h.to(tl.float32)
    y = hf * tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps) * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def triton_add_rms_norm(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float,
                        dtype: torch.dtype = torch.float32, shared: torch.Tensor | None = None,
                        gate: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_device(x.device)
    N = x.shape[-1]
    x, update = x.contiguous(), update.contiguous()
    h = torch.empty_like(x)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    s = shared.contiguous() if shared is not None else update
    g = gate.contiguous().float() if gate is not None else update
    _add_rms_norm_kernel[(x.numel() // N,)](x, update, s, g, weight.contiguous(), h, out, N, eps,
                                            SHARED=shared is not None, BLOCK=triton.next_power_of_2(N))
    return h, out
