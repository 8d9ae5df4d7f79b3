"""The configuration a trial runs: placement knobs (`placement`, `cpu_expert_layers`) become tensor overrides by
the one placement module for engines that do not take them as knobs, and a llama-fit-params baseline runs its own
overrides and tensor split. The stored configuration is what ran, so `export` needs no model file."""

from __future__ import annotations

from autoinfer.engines.base import TrialConfig
from autoinfer.errors import UserError
from autoinfer.model.placement import PLACEMENT_KEYS, realize
from autoinfer.search.context import SearchContext
from autoinfer.store.records import TrialRecord


def realize_trial(ctx: SearchContext, config: TrialConfig, asked: TrialRecord) -> TrialConfig:
    split = asked.fit_tensor_split
    if split is not None:
        kept = tuple((k, v) for k, v in config.extra if k != "tensor_split")
        config = config.with_(extra=(*kept, ("tensor_split", split)))
    fit = asked.fit_override_tensors
    if fit is not None:
        extra = tuple((k, v) for k, v in config.extra if k not in PLACEMENT_KEYS)
        return config.with_(override_tensors=tuple(fit), extra=extra)
    if "placement" in ctx.engine.knobs or "cpu_expert_layers" in ctx.engine.knobs:
        return config
    shape = ctx.shapes.get(str(config.model))
    if shape is None:
        if config.get("placement") is not None or config.get("cpu_expert_layers") is not None:
            raise UserError(f"placement parameters need the model's layer count; cannot read {config.model}")
        return config
    return realize(config, shape.n_layers)
