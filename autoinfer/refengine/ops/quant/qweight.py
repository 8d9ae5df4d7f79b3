"""A weight matrix kept in its GGUF block format: the raw bytes of each row in a uint8 tensor, decoded only inside
the kernels that read it (ops/quant/kernels.py). Q4_K weights take 4.5 bits per value instead of bf16's 16, so a
35B-A3B model fits the GPU and a decode step reads 3.6× fewer bytes.

Block layouts (ggml's block_q8_0, block_q4_K, block_q6_K):
  Q8_0: 34 bytes per 32 values  = fp16 d, 32 × int8 q;                      x = d·q
  Q4_K: 144 bytes per 256 values = fp16 d, fp16 dmin, 12 bytes of packed 6-bit (scale, min) of 8 sub-blocks of 32,
        128 bytes of nibbles;                                                x = d·scale_s·q − dmin·min_s
  Q6_K: 210 bytes per 256 values = 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × int8 scales, fp16 d;
        x = d·scale_s·(q − 32) over 16 sub-blocks of 16
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# qtype → (values per block, bytes per block)
BLOCKS = {"Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}


@dataclass(frozen=True)
class QuantWeight:
    """raw: uint8 [..., N, row_bytes], one GGUF row per output feature; shape: the logical [..., N, K]."""

    raw: torch.Tensor
    qtype: str
    shape: tuple[int, ...]

    @property
    def device(self) -> torch.device:
        return self.raw.device

    @property
    def blocks_per_row(self) -> int:
        return self.shape[-1] // BLOCKS[self.qtype][0]

    def to(self, device) -> "QuantWeight":
        return QuantWeight(self.raw.to(device), self.qtype, self.shape)

    def is_pinned(self) -> bool:
        return self.raw.is_pinned()

    def __getitem__(self, index) -> "QuantWeight":
        """Rows of a stacked (expert) weight: qw[i] is expert i's [N, K] matrix."""
        raw = self.raw[index]
        return QuantWeight(raw, self.qtype, (*raw.shape[:-1], self.shape[-1]))

    def nbytes(self) -> int:
        return self.raw.numel()


def from_gguf(data: np.ndarray, qtype: str, shape: tuple[int, ...]) -> QuantWeight:
    """data: the tensor's bytes as GGUFReader gives them; shape: numpy order [..., N, K]."""
    values, nbytes = BLOCKS[qtype]
    if shape[-1] % values:
        raise ValueError(f"{qtype} rows must be a multiple of {values} values, got {shape[-1]}")
    raw = np.array(data, dtype=np.uint8, copy=True).reshape(*shape[:-1], shape[-1] // values * nbytes)
    return QuantWeight(torch.from_numpy(raw), qtype, tuple(shape))
