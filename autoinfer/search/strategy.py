"""The interface between the campaign loop and a search strategy, and the choice of strategy.

The loop asks Optuna for each trial; a strategy steers it by queueing the configuration it wants measured next
(Optuna hands queued trials out first) and falls back to the campaign's sampler (TPE or random) when it has
nothing left to propose. Three calls:

- start(study): once, before the first trial (the study may already hold trials of an earlier run);
- screen(trial, config): before a trial runs: record why it was chosen, and return a Measurement instead of
  running it when it should not run (predicted over the memory budget, an exact repeat);
- observe(study): after every finished or screened trial: learn from it and queue the next proposal.

Every decision is written on the trial (TrialRecord.search_reason) so `status` can show it.
"""

from __future__ import annotations

from typing import Any, Protocol

import optuna

from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.search.informed import SearchAid


class Strategy(Protocol):
    name: str

    def start(self, study: optuna.Study) -> None: ...

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None: ...

    def observe(self, study: optuna.Study) -> None: ...


class InformedStart:
    """The earlier search: a fixed informed start (largest placement predicted to fit, its neighbours,
    llama-fit-params' answer), then the sampler. Kept as a baseline for `autoinfer replay`."""

    name = "informed"

    def __init__(self, aid: SearchAid, dists: dict[str, Any]) -> None:
        self.aid = aid
        self.dists = dists

    def start(self, study: optuna.Study) -> None:
        self.aid.enqueue_start(study, self.dists)
        self.aid.after_run(study)

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        return self.aid.before_run(trial, config)

    def observe(self, study: optuna.Study) -> None:
        self.aid.after_run(study)
