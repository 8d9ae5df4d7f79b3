"""The per-sequence caches: KV for attention layers, conv window + recurrent state for GDN layers.

A state is dynamic (the KV cache grows by doubling, attention reads the valid prefix) or static (fixed capacity,
attention reads all of it under the causal mask, every update in place): a static state keeps its tensors at fixed
addresses, which is what a CUDA graph of the decode step needs (graphs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autoinfer.errors import UserError
from autoinfer.model.arch import Architecture


@dataclass
class KVCache:
    """Keys/values [Hkv, capacity, D]; `length` positions are valid."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0
    static: bool = False

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [Hkv, T, D] at `positions` (a device tensor: the write needs no host value) and return the
        keys and values attention reads: the valid prefix, or the whole static buffer (the mask hides the rest)."""
        end = self.reserve(k.shape[1])
        self.k.index_copy_(1, positions, k)
        self.v.index_copy_(1, positions, v)
        if self.static:
            return self.k, self.v
        return self.k[:, :end], self.v[:, :end]

    def reserve(self, n: int) -> int:
        """Room for n more positions (a dynamic cache grows by doubling), counted as written; the new length. For a
        kernel that writes the positions itself (ops/attention)."""
        end = self.length + n
        if end > self.k.shape[1]:
            if self.static:
                raise UserError(f"the sequence reached {end} tokens, beyond the static cache's {self.k.shape[1]}; "
                                "raise the engine's max_context")
            grow = max(self.k.shape[1], end)
            self.k = torch.cat([self.k, self.k.new_zeros(self.k.shape[0], grow, self.k.shape[2])], dim=1)
            self.v = torch.cat([self.v, self.v.new_zeros(self.v.shape[0], grow, self.v.shape[2])], dim=1)
        self.length = end
        return end

    def clone(self) -> "KVCache":
        """A dynamic copy of the valid positions, also of a static cache: a snapshot, or the state the decode graph
        saves while it records, need not hold empty capacity (640 MiB at 32768 positions on the 35B-A3B, which the
        recording's copy once added to every measured peak); load_ copies it back into a static one."""
        return KVCache(self.k[:, :self.length].clone(), self.v[:, :self.length].clone(), self.length)

    def load_(self, other: "KVCache") -> None:
        """Copy `other` into this (static) cache's buffers."""
        if other.length > self.k.shape[1]:
            raise UserError(f"a state of {other.length} tokens does not fit the static cache's {self.k.shape[1]}; "
                            "raise the engine's max_context")
        self.k[:, :other.length].copy_(other.k[:, :other.length])
        self.v[:, :other.length].copy_(other.v[:, :other.length])
        self.length = other.length

    def nbytes(self) -> int:
        return 2 * self.length * self.k.shape[0] * self.k.shape[2] * self.k.element_size()


@dataclass
class GdnState:
    conv: torch.Tensor  # [kernel − 1, C]: the last inputs of the causal conv
    recurrent: torch.Tensor  # [Hv, dk, dv] fp32

    def clone(self) -> "GdnState":
        return GdnState(self.conv.clone(), self.recurrent.clone())

    def load_(self, other: "GdnState") -> None:
        self.conv.copy_(other.conv)
        self.recurrent.copy_(other.recurrent)

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * 4


@dataclass
class SequenceState:
    layers: list[KVCache | GdnState]
    position: int = 0
    tokens: list[int] = field(default_factory=list)  # what has been consumed, for prefix snapshots

    @classmethod
    def empty(cls, cfg: Architecture, device: torch.device, dtype: torch.dtype, capacity: int = 256,
              static: bool = False) -> "SequenceState":
        layers: list[KVCache | GdnState] = []
        for i in range(cfg.n_layers):
            if cfg.is_attention(i):
                shape = (cfg.n_kv_heads, capacity, cfg.head_dim)
                layers.append(KVCache(torch.zeros(shape, dtype=dtype, device=device),
                                      torch.zeros(shape, dtype=dtype, device=device), static=static))
            else:
                layers.append(GdnState(
                    torch.zeros(cfg.conv_kernel - 1, cfg.conv_dim, dtype=torch.float32, device=device),
                    torch.zeros(cfg.gdn_v_heads, cfg.gdn_head_dim, cfg.gdn_head_dim, dtype=torch.float32,
                                device=device)))
        return cls(layers)

    def advance(self, tokens: list[int]) -> None:
        """Book-keeping after the network consumed `tokens` (the caches were updated by the network itself)."""
        self.position += len(tokens)
        self.tokens.extend(tokens)
        for layer in self.layers:
            if isinstance(layer, KVCache):
                layer.length = self.position

    def reset_(self) -> None:
        """Back to an empty sequence, in place (a static state keeps its buffers)."""
        for layer in self.layers:
            if isinstance(layer, KVCache):
                layer.length = 0
            else:
                layer.conv.zero_()
                layer.recurrent.zero_()
        self.position = 0
        self.tokens.clear()

    def load_(self, other: "SequenceState") -> None:
        """This state's buffers take `other`'s contents (a snapshot resumed into a static state)."""
        for mine, theirs in zip(self.layers, other.layers):
            mine.load_(theirs)
        self.position, self.tokens = other.position, list(other.tokens)

    def clone(self) -> "SequenceState":
        return SequenceState([layer.clone() for layer in self.layers], self.position, list(self.tokens))

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
