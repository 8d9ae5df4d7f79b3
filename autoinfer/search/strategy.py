"""The interface between the campaign loop and a search strategy.

The loop asks Optuna for each trial; a strategy steers it by queueing the configuration it wants measured next
(Optuna hands queued trials out first) and falls back to the campaign's sampler (TPE or random) when it has
nothing left to propose. Three calls:

- start(study): once, before the first trial (the study may already hold trials of an earlier run);
- screen(trial, config): before a trial runs: record why it was chosen, and return a Measurement instead of
  running it when it should not run (predicted over the memory budget);
- observe(study): after every finished or screened trial: learn from it and queue the next proposal.

Every decision is written on the trial (TrialRecord.search_reason) so `status` can show it.
"""

from __future__ import annotations

from typing import Protocol

import optuna

from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.pareto import remember

SAMPLED = "sampler:"  # the reason of a trial the strategy left to the campaign's sampler


class Strategy(Protocol):
    name: str

    def start(self, study: optuna.Study) -> None: ...

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None: ...

    def observe(self, study: optuna.Study) -> None: ...


def learn(memory: MemoryScreen, campaign: Campaign, study: optuna.Study) -> None:
    """What every strategy does with a finished trial: recalibrate the memory model; keep the Pareto front on the
    study in multi-objective mode."""
    memory.calibrate(study)
    if campaign.objective == "pareto":
        remember(study)
