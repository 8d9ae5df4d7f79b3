"""Searched parameters as the engine runs them: the trial's configuration, the command key that tells two
parameter sets llama.cpp runs alike, and the memory model's predicted peak."""

from __future__ import annotations

from typing import Any

from autoinfer.campaign.space import to_config
from autoinfer.search.context import SearchContext
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.seen import config_key
from autoinfer.trial_config import TrialConfig


class Configs:
    """One sweep's translation of parameters, with the command keys remembered (every proposal asks them of every
    trial again)."""

    def __init__(self, ctx: SearchContext, memory: MemoryScreen) -> None:
        self.ctx = ctx
        self.memory = memory
        self._commands: dict[str, str] = {}

    def config(self, params: dict[str, Any]) -> TrialConfig:
        return self.ctx.engine.as_run(to_config(self.ctx.campaign, params, self.ctx.models))

    def same(self, params: dict[str, Any]) -> str:
        """A key equal for parameters llama.cpp runs alike: the placement pattern is moot where no layer's experts,
        or every layer's, are in RAM (the same tensors on the same devices). Such a configuration is not measured
        again under another pattern's name (synthetic-298 at 16 GiB measured all three patterns with no expert in
        RAM, benchmarks/results/search-efficiency.md)."""
        key = config_key(params)
        if key not in self._commands:
            self._commands[key] = self.ctx.command_of(self.config(params))
        return self._commands[key]

    def predict(self, config: TrialConfig) -> float | None:
        pred = self.memory.predict(config)
        return pred.mib if pred is not None else None
