"""The expert weights one MoE op call reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertBank:
    """Expert weights stacked by row: gate/up [R, F, E], down [R, E, F] (torch Linear layout); dense tensors or
    QuantWeight (GGUF blocks)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor

    @property
    def rows(self) -> int:
        return self.gate.shape[0]
