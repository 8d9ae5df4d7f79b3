"""Routed-expert FFN variants, selectable by name. All share one signature:

    fn(x, token, row, weight, bank) -> y

x: [N, E] tokens; the A assignments (token[a], row[a], weight[a]) say that token[a] goes to the expert stored in
row[a] of `bank` with routing weight[a]. y: [N, E] fp32 = Σ_a weight[a] · down(SiLU(gate x) ⊙ up x). The bank is
either all experts of a layer or the slots of the expert cache. `loop` is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from autoinfer.refengine.ops.variants import pick


@dataclass(frozen=True)
class ExpertBank:
    """Expert weights stacked by row: gate/up [R, F, E], down [R, E, F] (torch Linear layout)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor

    @property
    def rows(self) -> int:
        return self.gate.shape[0]


MoeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ExpertBank], torch.Tensor]

from autoinfer.refengine.ops.moe.grouped import grouped_experts  # noqa: E402  (needs ExpertBank)
from autoinfer.refengine.ops.moe.loop import loop_experts  # noqa: E402

VARIANTS: dict[str, MoeFn] = {"loop": loop_experts, "grouped": grouped_experts}
REFERENCE = "loop"


def get(name: str) -> MoeFn:
    return pick("moe", VARIANTS, name)
