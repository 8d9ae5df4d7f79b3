"""What a search knows before its first trial: the campaign, the engine, each model's shape, and the memory budget
(host or device side, how much, on how many GPUs). Strategies, the memory screen and the informed start share it;
`notes` collects what it could not know (no shape, no budget) so `status` can say so."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoinfer.campaign.space import allowed
from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Engine, TrialConfig, capabilities
from autoinfer.engines.knobs import context_knob
from autoinfer.errors import UserError
from autoinfer.measure.gpu import measured_gpus
from autoinfer.model.memory import MemoryModel, measured_context
from autoinfer.model.placement import PLACEMENT_KEYS, command_key
from autoinfer.model.shape import ModelShape


def typical(campaign: Campaign, name: str) -> Any:
    """The value a strategy starts a non-placement parameter at: llama.cpp's default if allowed, else the middle
    value."""
    values = allowed(campaign, name) or []
    default = TrialConfig.__dataclass_fields__.get(name)
    if default is not None and default.default in values:
        return default.default
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)[len(values) // 2]
    return values[0]


@dataclass
class SearchContext:
    """One per sweep."""

    campaign: Campaign
    engine: Engine
    models: dict[str, str]  # name → path
    shapes: dict[str, ModelShape] = field(default_factory=dict)  # by path
    side: str | None = None  # "device" (vram_mib budget) or "host" (ram_mib budget); None: no budget
    budget_mib: float | None = None  # per GPU on several GPUs
    n_gpus: int = 1  # GPUs this worker measures
    notes: list[str] = field(default_factory=list)
    _commands: dict[str, str] = field(default_factory=dict, repr=False)
    _physical: dict[str, MemoryModel] = field(default_factory=dict, repr=False)  # uncalibrated, by path

    def command(self, stored: Mapping[str, Any]) -> str:
        """A key equal for stored configurations (TrialRecord.config) llama.cpp runs alike: a placement pattern
        named by a table's column is moot where no layer's experts, or every layer's, are in RAM
        (placement.command_key)."""
        given = json.dumps(stored, sort_keys=True, default=str)
        if given not in self._commands:
            self._commands[given] = self.command_of(TrialConfig.from_params(dict(stored)))
        return self._commands[given]

    def command_of(self, config: TrialConfig) -> str:
        """placement.command_key with the layer count of the config's model, where its shape is known."""
        shape = self.shapes.get(str(config.model))
        return command_key(config, shape.n_layers if shape is not None else None)

    @property
    def counts_context(self) -> bool:
        """The campaign serves a context its engine does not measure at (serve.context with llama-bench or a replay
        table): each trial's peak is held to the budget with that context's growth on top."""
        return (self.campaign.serve.context is not None and self.side is not None
                and context_knob(self.campaign.engine) not in self.engine.knobs)

    def measured(self, config: TrialConfig) -> TrialConfig:
        """`config` at the context its measurement created (its memory model's calibration reads that one)."""
        return measured_context(config) if self.counts_context else config

    def context_growth(self, config: TrialConfig) -> float | None:
        """MiB the serving context adds to `config`'s measured peak on the budget's side; None where nothing is
        added (no serving context beyond the measurement's, or the engine measures at it)."""
        if not self.counts_context:
            return None
        path = str(config.model)
        if path not in self._physical:
            self._physical[path] = MemoryModel(self.shapes[path], self.side, self.n_gpus)  # type: ignore[arg-type]
        return round(self._physical[path].context_growth(config, measured_context(config)), 1)

    @classmethod
    def create(cls, campaign: Campaign, engine: Engine, models: dict[str, str]) -> "SearchContext":
        ctx = cls(campaign, engine, models)
        c = campaign.constraints
        ctx.side, ctx.budget_mib = c.side, c.vram_mib or c.ram_mib
        ctx.n_gpus = engine.n_gpus or max(len(measured_gpus()), 1)
        if not capabilities(campaign.engine).llama_settings:  # the memory and performance models are llama.cpp's
            if ctx.counts_context:
                raise UserError(f"serve.context: engine {campaign.engine!r} has no {context_knob(campaign.engine)} "
                                "and no memory model to count the context; drop serve.context")
            if ctx.side is not None:
                ctx.notes.append(f"engine {campaign.engine!r} places its memory itself, not by llama.cpp's rules: no "
                                 "memory model predicts its peaks, so every trial is measured against the budget")
            return ctx
        if ctx.side == "device" and ctx.n_gpus > 1:
            ctx.notes.append(f"{ctx.n_gpus} GPUs: the memory model predicts each GPU's peak against "
                             f"{c.vram_mib:.0f} MiB (layers shared by tensor_split, experts by expert_split)")
        if ctx.side is not None or any(k in campaign.space for k in PLACEMENT_KEYS):
            for path in dict.fromkeys(models.values()):
                shape = engine.model_shape(path)
                if shape is None:
                    ctx.notes.append(f"no model shape for {Path(path).name} (a replay table without its "
                                     ".shape.json): no memory model, placements not translated")
                else:
                    ctx.shapes[path] = shape
        missing = [Path(p).name for p in dict.fromkeys(models.values()) if p not in ctx.shapes]
        if ctx.counts_context and missing:
            raise UserError(f"serve.context {campaign.serve.context}: the {ctx.side} budget must count that context's "
                            f"KV cache, which needs the model's shape, and {missing[0]} has none; give the replay "
                            "table its .shape.json or drop serve.context")
        return ctx
