"""Which strategy a campaign searches with."""

from __future__ import annotations

from typing import Any

from autoinfer.search.boundary import Boundary
from autoinfer.search.context import SearchContext
from autoinfer.search.informed import InformedStart
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.strategy import Strategy


def create(ctx: SearchContext, memory: MemoryScreen, dists: dict[str, Any]) -> Strategy:
    """`search.strategy` when the informed search is on; otherwise the sampler alone (with the memory screen and
    its calibration, which InformedStart keeps when it queues nothing)."""
    search = ctx.campaign.search
    if search.informed and search.strategy == "boundary":
        return Boundary(ctx, memory, dists)
    return InformedStart(ctx, memory, dists)
