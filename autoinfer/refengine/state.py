"""The per-sequence caches: KV for attention layers, conv window + recurrent state for GDN layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autoinfer.model.arch import Architecture


@dataclass
class KVCache:
    """Keys/values [Hkv, capacity, D]; `length` positions are valid. Grows by doubling."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[1]
        if self.length + n > self.k.shape[1]:
            grow = max(self.k.shape[1], self.length + n)
            self.k = torch.cat([self.k, self.k.new_zeros(self.k.shape[0], grow, self.k.shape[2])], dim=1)
            self.v = torch.cat([self.v, self.v.new_zeros(self.v.shape[0], grow, self.v.shape[2])], dim=1)
        self.k[:, self.length:self.length + n] = k
        self.v[:, self.length:self.length + n] = v
        self.length += n
        return self.k[:, :self.length], self.v[:, :self.length]

    def clone(self) -> "KVCache":
        return KVCache(self.k[:, :self.length].clone(), self.v[:, :self.length].clone(), self.length)

    def nbytes(self) -> int:
        return 2 * self.length * self.k.shape[0] * self.k.shape[2] * self.k.element_size()


@dataclass
class GdnState:
    conv: torch.Tensor  # [kernel − 1, C]: the last inputs of the causal conv
    recurrent: torch.Tensor  # [Hv, dk, dv] fp32

    def clone(self) -> "GdnState":
        return GdnState(self.conv.clone(), self.recurrent.clone())

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * 4


@dataclass
class SequenceState:
    layers: list[KVCache | GdnState]
    position: int = 0
    tokens: list[int] = field(default_factory=list)  # what has been consumed, for prefix snapshots

    @classmethod
    def empty(cls, cfg: Architecture, device: torch.device, dtype: torch.dtype, capacity: int = 256) -> "SequenceState":
        layers: list[KVCache | GdnState] = []
        for i in range(cfg.n_layers):
            if cfg.is_attention(i):
                shape = (cfg.n_kv_heads, capacity, cfg.head_dim)
                layers.append(KVCache(torch.zeros(shape, dtype=dtype, device=device),
                                      torch.zeros(shape, dtype=dtype, device=device)))
            else:
                layers.append(GdnState(
                    torch.zeros(cfg.conv_kernel - 1, cfg.conv_dim, dtype=torch.float32, device=device),
                    torch.zeros(cfg.gdn_v_heads, cfg.gdn_head_dim, cfg.gdn_head_dim, dtype=torch.float32,
                                device=device)))
        return cls(layers)

    def clone(self) -> "SequenceState":
        return SequenceState([layer.clone() for layer in self.layers], self.position, list(self.tokens))

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
