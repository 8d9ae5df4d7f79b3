"""Which strategy a campaign searches with."""

from __future__ import annotations

from typing import Any

from autoinfer.campaign.spec import Campaign
from autoinfer.search.boundary import Boundary
from autoinfer.search.informed import SearchAid
from autoinfer.search.strategy import InformedStart, Strategy


def create(campaign: Campaign, aid: SearchAid, dists: dict[str, Any], models: dict[str, str]) -> Strategy:
    """`search.strategy` when the informed search is on; otherwise the sampler alone (with the memory model's
    screening and calibration, which InformedStart keeps when it queues nothing)."""
    if campaign.search.informed and campaign.search.strategy == "boundary":
        return Boundary(campaign, aid, dists, models)
    return InformedStart(aid, dists)
