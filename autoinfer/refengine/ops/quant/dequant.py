"""Q8_0, Q4_0 and Q4_K blocks → float tensors in torch; every other type goes through gguf.quants (the reference).

gguf.quants is single-threaded numpy (~30–100 M values/s): a 35B-parameter model would take many minutes to load.
The two block formats the synthetic models use are simple enough to decode with a few tensor ops:
  Q8_0: 34-byte blocks = fp16 scale d, 32 × int8 q;  x = d·q
  Q4_0: 18-byte blocks = fp16 scale d, 16 bytes of nibbles; x_i = d·(low nibble of byte i − 8) for i < 16,
        x_{16+i} = d·(high nibble of byte i − 8)
  Q4_K: 144-byte super-blocks of 256 = fp16 d, fp16 dmin, 12 bytes of packed 6-bit (scale, min) for 8 sub-blocks,
        128 bytes of nibbles; x = d·scale_j·q − dmin·min_j (the layout of gguf.quants.Q4_K / ggml's block_q4_K)
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 32
FAST = ("Q8_0", "Q4_0", "Q4_K")
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_K": 144}


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...], device: str | torch.device = "cpu") -> torch.Tensor:
    """raw: the tensor's bytes as GGUFReader gives them (uint8 rows); shape: numpy order. Returns fp32."""
    name = qtype.name
    if name not in FAST:
        from gguf import quants

        return torch.from_numpy(np.array(quants.dequantize(raw, qtype), dtype=np.float32, copy=True))
    raw = np.array(raw, dtype=np.uint8, copy=True).reshape(-1)  # the memory map is read-only; torch wants writable
    blocks = torch.from_numpy(raw).to(device).view(-1, _BLOCK_BYTES[name])
    if name == "Q4_K":
        return _q4_k(blocks).reshape(shape)
    scale = blocks[:, :2].contiguous().view(torch.float16).float()  # [n_blocks, 1]
    if name == "Q8_0":
        values = blocks[:, 2:].contiguous().view(torch.int8).float()
    else:
        packed = blocks[:, 2:].to(torch.int16)
        values = torch.cat([packed & 0x0F, packed >> 4], dim=1).float() - 8.0
    return (values * scale).reshape(shape)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # [n, 1]
    dmin = blocks[:, 2:4].contiguous().view(torch.float16).float()
    packed = blocks[:, 4:16].to(torch.int16).view(n, 3, 4)
    lo, hi, mix = packed[:, 0], packed[:, 1], packed[:, 2]
    scale = torch.cat([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], dim=-1).float()  # [n, 8]
    mins = torch.cat([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], dim=-1).float()
    qs = blocks[:, 16:].to(torch.int16).view(n, 4, 1, 32)  # 4 groups of 32 bytes: low nibbles, then high
    q = ((qs >> torch.tensor([0, 4], dtype=torch.int16, device=blocks.device).view(1, 1, 2, 1)) & 0x0F)
    q = q.reshape(n, 8, 32).float()
    return ((d * scale)[..., None] * q - (dmin * mins)[..., None]).reshape(n, 256)
