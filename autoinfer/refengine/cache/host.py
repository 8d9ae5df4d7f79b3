"""Routed experts computed on the host (misses: cpu): an expert-cache miss's FFN from the expert's host-resident
copy, on the CPU with torch's intra-op threads (the engine's torch_threads), instead of copying the expert into a
device slot. Whether that is cheaper depends on the machine (PCIe bandwidth against the host's cores and memory):
benchmarks/expert_miss_cost.py times both per miss (benchmarks/results/expert-miss-cost-h200.md).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.ops.quant.dequant import decode
from autoinfer.refengine.ops.quant.qweight import QuantWeight

# Decoded experts kept on the host: ~85 of the 35B-A3B shape in fp32 (12 MiB each), the misses of about two decode
# steps when 14% of a step's 320 choices miss (the 8 GiB budget's measured rate, README), beside the 19 GiB the
# model's experts already take there.
DECODED_MIB = 1024


class HostExperts:
    """The SwiGLU FFN of chosen experts on the host, from the banks the expert cache copies from. Experts kept in
    GGUF blocks are decoded to fp32 (ops/quant/dequant.py), only the three matrices of each expert asked for, into an
    LRU of DECODED_MIB: a miss computed here is not admitted to the device cache, so while routing repeats the same
    expert misses again and then finds its matrices decoded. Dense host experts are read as they are."""

    def __init__(self, host: list[ExpertBank]):
        self.host = host
        ref = host[0]
        self.quantized = isinstance(ref.gate, QuantWeight)
        decoded_bytes = sum(math.prod(t.shape[1:]) for t in (ref.gate, ref.up, ref.down)) * 4
        self.capacity = DECODED_MIB * 2**20 // decoded_bytes
        self.decoded: OrderedDict[tuple[int, int], tuple[torch.Tensor, ...]] = OrderedDict()

    def matrices(self, layer: int, e: int) -> tuple[tuple[torch.Tensor, ...], bool]:
        """(gate [F, E], up [F, E], down [E, F]) of expert e, and whether its blocks were decoded for this call."""
        bank = self.host[layer]
        if not self.quantized:
            return (bank.gate[e], bank.up[e], bank.down[e]), False
        key = (layer, e)
        if key in self.decoded:
            self.decoded.move_to_end(key)
            return self.decoded[key], False
        found = tuple(decode(t.raw[e], t.qtype).view(t.shape[1:]) for t in (bank.gate, bank.up, bank.down))
        self.decoded[key] = found
        if len(self.decoded) > self.capacity:
            self.decoded.popitem(last=False)
        return found, True

    def run(self, layer: int, x: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Assignment a: token x[a] [A, E] through expert[a] of `layer` under routing weight[a] (host tensors), as
        ops/moe's loop reference computes it. Returns (weight[a] · down(SiLU(gate x[a]) ⊙ up x[a]) [A, E] fp32, the
        number of experts whose blocks were decoded)."""
        out = torch.empty(x.shape, dtype=torch.float32)
        decoded = 0
        for a, e in enumerate(expert.tolist()):  # one assignment an expert, as the cache sends them
            (gate, up, down), fresh = self.matrices(layer, e)
            decoded += fresh
            xa = x[a:a + 1].to(gate.dtype)
            h = (F.silu(xa @ gate.T) * (xa @ up.T)).to(x.dtype)  # rounded as the device kernels store it
            out[a:a + 1] = (h.to(down.dtype) @ down.T).float() * weight[a].float()
        return out, decoded
