"""Q8_0, Q4_0, Q4_K and Q6_K blocks → float tensors in torch; every other type goes through gguf.quants (the
reference).

gguf.quants is single-threaded numpy (~30–100 M values/s): a 35B-parameter model would take many minutes to load.
The block formats the synthetic models and the K-quant files use are simple enough to decode with a few tensor ops
(`decode` on the blocks as a uint8 tensor: the loader's, and the host-side expert FFN's of misses: cpu):
  Q8_0: 34-byte blocks = fp16 scale d, 32 × int8 q;  x = d·q
  Q4_0: 18-byte blocks = fp16 scale d, 16 bytes of nibbles; x_i = d·(low nibble of byte i − 8) for i < 16,
        x_{16+i} = d·(high nibble of byte i − 8)
  Q4_K: 144-byte super-blocks of 256 = fp16 d, fp16 dmin, 12 bytes of packed 6-bit (scale, min) for 8 sub-blocks,
        128 bytes of nibbles; x = d·scale_j·q − dmin·min_j (the layout of gguf.quants.Q4_K / ggml's block_q4_K)
  Q6_K: 210-byte super-blocks of 256 = 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 × int8 scales,
        fp16 d; x = d·scale_j·(q − 32) over 16 sub-blocks of 16 (ggml's block_q6_K)
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 32
FAST = ("Q8_0", "Q4_0", "Q4_K", "Q6_K")
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_K": 144, "Q6_K": 210}


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...], device: str | torch.device = "cpu") -> torch.Tensor:
    """raw: the tensor's bytes as GGUFReader gives them (uint8 rows); shape: numpy order. Returns fp32."""
    name = qtype.name
    if name not in FAST:
        from gguf import quants

        return torch.from_numpy(np.array(quants.dequantize(raw, qtype), dtype=np.float32, copy=True))
    raw = np.array(raw, dtype=np.uint8, copy=True).reshape(-1)  # the memory map is read-only; torch wants writable
    return decode(torch.from_numpy(raw).to(device), name).reshape(shape)


def decode(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """Whole blocks of one of FAST's types (a contiguous uint8 tensor of any shape) → their values, flat, fp32."""
    blocks = raw.reshape(-1, _BLOCK_BYTES[qtype])
    if qtype == "Q4_K":
        return _q4_k(blocks).reshape(-1)
    if qtype == "Q6_K":
        return _q6_k(blocks).reshape(-1)
    scale = blocks[:, :2].contiguous().view(torch.float16).float()  # [n_blocks, 1]
    if qtype == "Q8_0":
        values = blocks[:, 2:].contiguous().view(torch.int8).float()
    else:
        packed = blocks[:, 2:].to(torch.int16)
        values = torch.cat([packed & 0x0F, packed >> 4], dim=1).float() - 8.0
    return (values * scale).reshape(-1)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # [n, 1]
    dmin = blocks[:, 2:4].contiguous().view(torch.float16).float()
    packed = blocks[:, 4:16].to(torch.int16).view(n, 3, 4)
    lo, hi, mix = packed[:, 0], packed[:, 1], packed[:, 2]
    scale = torch.cat([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], dim=-1).float()  # [n, 8]
    mins = torch.cat([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], dim=-1).float()
    qs = blocks[:, 16:].view(n, 4, 32)  # 4 groups of 32 bytes: low nibbles one sub-block, high nibbles the next
    q = torch.cat([qs & 0x0F, qs >> 4], dim=2).view(n, 8, 32).float()
    return q.mul_((d * scale)[..., None]).sub_((dmin * mins)[..., None]).view(n, 256)  # in place: one 4n KiB array


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """Value 128·h + 32·j + l (half h, quarter j, lane l) = low nibble (j < 2) or high nibble (j ≥ 2) of ql byte
    64·h + 32·(j mod 2) + l, with bits 2j, 2j+1 of qh byte 32·h + l above it; sub-block scales of 16 values."""
    n = blocks.shape[0]
    ql = blocks[:, :128].view(n, 2, 2, 32)
    qh = blocks[:, 128:192].view(n, 2, 1, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # [n, half, quarter, lane]
    high = torch.cat([(qh & 3) << 4, (qh & 12) << 2, qh & 48, (qh >> 2) & 48], dim=2)  # bits 4, 5 of each value
    q = (low | high).view(torch.int8) - 32
    d = blocks[:, 208:210].contiguous().view(torch.float16).float()  # [n, 1]
    scale = d * blocks[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    return q.view(n, 16, 16).float().mul_(scale[..., None]).view(n, 256)
