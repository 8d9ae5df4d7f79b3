"""Campaign parameters → Optuna distributions, and a suggested trial → TrialConfig."""

from __future__ import annotations

from typing import Any

import optuna
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
            out[name] = IntDistribution(spec.low, spec.high, step=1 if spec.log else spec.step, log=spec.log)
        elif isinstance(spec, FloatRange):
            out[name] = FloatDistribution(spec.low, spec.high, log=spec.log)
        else:
            out[name] = CategoricalDistribution(list(spec))
    return out


def suggest(trial: optuna.Trial, dists: dict[str, BaseDistribution]) -> dict[str, Any]:
    """Ask Optuna for every searched parameter (enqueued trials get their fixed values back)."""
    params: dict[str, Any] = {}
    for name, dist in dists.items():
        if isinstance(dist, IntDistribution):
            params[name] = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        elif isinstance(dist, FloatDistribution):
            params[name] = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
        else:
            params[name] = trial.suggest_categorical(name, dist.choices)
    return params


def to_config(campaign: Campaign, params: dict[str, Any], models: dict[str, str]) -> TrialConfig:
    """Merge fixed and suggested parameters into a TrialConfig; `models` maps campaign model names to files."""
    merged = {**campaign.fixed(), **params}
    merged["model"] = models[merged["model"]]
    return TrialConfig.from_params(merged)
