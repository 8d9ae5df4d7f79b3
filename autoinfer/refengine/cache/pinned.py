"""Page-locked host memory for the experts the device copies from, in few blocks whose sizes are powers of two.

torch's pin_memory() takes each tensor's block from its caching host allocator, which rounds the block up to the next
power of two: every 144 MiB Q4_K expert tensor of the 35B-A3B took 256 MiB, 30 GiB for 16.9 GiB of experts, and the
engine's process peaked at 52 GB of RSS beside llama.cpp's 19 GB (benchmarks/results/contest-h100-ctx32768.md).
Here the tensors are copied into blocks the allocator hands out at their exact size (a power of two, at most
MAX_BLOCK), each filled in order before the next is taken; a block is sized from what remains to be placed, so only
the unfilled end of each block is lost. Views of a block keep it alive, as any torch view does.
"""

from __future__ import annotations

import torch

from autoinfer.refengine.ops.quant.qweight import QuantWeight

MAX_BLOCK = 2**32  # 4 GiB: 28 of the 35B-A3B's Q4_K expert tensors, 64 MiB unfilled
ALIGN = 512  # each tensor's start in its block, enough for any element type and for wide loads


def block_size(need: int, left: int, max_block: int = MAX_BLOCK) -> int:
    """The block to take for a tensor of `need` bytes when `left` bytes (it included) remain to be placed: the
    largest power of two within min(left, max_block), or the smallest that holds the tensor if that is larger."""
    want = max(need, min(left, max_block))
    size = 1 << (want.bit_length() - 1)
    return size if size >= need else size * 2


class PinnedArena:
    """Copies of host tensors packed into page-locked blocks; pin=False takes ordinary host memory the same way (the
    packing, on a machine without a GPU). `total_bytes`: what will be placed in all, which sizes the last blocks."""

    def __init__(self, total_bytes: int, pin: bool = True, max_block: int = MAX_BLOCK):
        self.left, self.pin, self.max_block = total_bytes, pin, max_block
        self.blocks: list[torch.Tensor] = []
        self.used = 0  # bytes of the last block taken so far

    @property
    def block_bytes(self) -> int:
        """What the blocks hold in all, filled or not."""
        return sum(b.numel() for b in self.blocks)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """t's values in this arena, same dtype and shape."""
        n = t.numel() * t.element_size()
        start = -(-self.used // ALIGN) * ALIGN
        if not self.blocks or start + n > self.blocks[-1].numel():
            size = block_size(n, max(self.left, n), self.max_block)
            self.blocks.append(torch.empty(size, dtype=torch.uint8, pin_memory=self.pin))
            start = 0
        out = self.blocks[-1][start:start + n].view(t.dtype).view(t.shape)
        out.copy_(t)
        self.used, self.left = start + n, self.left - n
        return out

    def place(self, w: torch.Tensor | QuantWeight) -> torch.Tensor | QuantWeight:
        """A dense weight or a quantized one's blocks, copied here."""
        if isinstance(w, QuantWeight):
            return QuantWeight(self.copy(w.raw), w.qtype, w.shape)
        return self.copy(w)
