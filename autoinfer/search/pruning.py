"""Cutting a trial short: its first repetition far below the best median so far (`search.prune_below`) says
enough; the trial is recorded as pruned, and that repetition still counts as evidence for the search."""

from __future__ import annotations

import statistics
from typing import Callable

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.store.trials import Store


def first_repetition_rule(campaign: Campaign, study: optuna.Study,
                          config: TrialConfig) -> Callable[[float], bool] | None:
    """A rule for the engine's first repetition: cut it when below prune_below × the best median so far."""
    below = campaign.search.prune_below
    kind = "tg" if config.n_gen else "pp"
    if below is None or kind not in campaign.objective_weights():
        return None
    medians = [statistics.median(t.samples(kind)) for t in Store(study).records(states=(TrialState.COMPLETE,))
               if t.is_feasible_ok and t.samples(kind)]
    if not medians:
        return None
    threshold = below * max(medians)
    return lambda first: first < threshold
