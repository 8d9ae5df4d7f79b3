"""Campaign parameters → Optuna distributions (study.ask suggests them all), and a trial's parameters →
TrialConfig."""

from __future__ import annotations

from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autoinfer.campaign.spec import Campaign, FloatRange, IntRange
from autoinfer.engines.base import TrialConfig


def distributions(campaign: Campaign) -> dict[str, BaseDistribution]:
    """One Optuna distribution per searched parameter, in the campaign's order."""
    out: dict[str, BaseDistribution] = {}
    for name, spec in campaign.searched().items():
        if isinstance(spec, IntRange):
            out[name] = IntDistribution(spec.low, spec.high, step=spec.step, log=spec.log)
        elif isinstance(spec, FloatRange):
            out[name] = FloatDistribution(spec.low, spec.high, log=spec.log)
        else:
            out[name] = CategoricalDistribution(list(spec))
    return out


def allowed(campaign: Campaign, name: str) -> list[Any] | None:
    """Every value a parameter may take in the campaign, of a float range its ends and middle (None: not in the
    space). Asked whether a value belongs to the space and for the GPU shares to enumerate; the boundary search's
    knob values come from the Optuna distributions instead (search.boundary.allowed_values: fewer of a log range)."""
    spec = campaign.space.get(name)
    if spec is None:
        return None
    if isinstance(spec, IntRange):
        return list(range(spec.low, spec.high + 1, spec.step))
    if isinstance(spec, FloatRange):
        return [spec.low, (spec.low + spec.high) / 2, spec.high]
    return list(spec) if isinstance(spec, list) else [spec]


def to_config(campaign: Campaign, params: dict[str, Any], models: dict[str, str]) -> TrialConfig:
    """Merge fixed and suggested parameters into a TrialConfig; `models` maps campaign model names to files."""
    merged = {**campaign.fixed(), **params}
    merged["model"] = models[merged["model"]]
    return TrialConfig.from_params(merged)
