"""No accidental repeats: a configuration already measured runs again only as a deliberate, tagged re-measurement.

A sampler proposes a configuration it has seen whenever the space is small or its model is sure, and after a
crash a resumed study can do the same. Running it again spends budget on nothing new, and an untagged duplicate
reads like a new result. Such a suggestion is answered without running anything: the trial is told the earlier
measurement's values (so TPE stays informed), tagged `repeat_of=N`, and recorded as unmeasured, which costs no
budget; one that another worker is measuring right now is pruned the same way. A sampler sure of itself suggests
the same few configurations again and again, and workers with one seed suggest what another is running: after
`NUDGE_AFTER` repeats in a row, or at once after a running one, a configuration no trial has measured or left out
(predicted over the budget or slower) drawn at random is queued (said and tagged `explore_after_repeats`), and when
none is left the space is exhausted. The same configuration is the same command line: a placement pattern is moot
where no layer's experts, or every layer's, are in RAM.
Re-measurements the project makes on purpose carry their own tag (drift: `remeasure_of`, the search's incumbent:
`again_of`) and run as usual. A dead process's trial queued again (`retry_of`) is checked like a suggestion: the
process may have died after the sampler suggested a configuration already measured and before it was answered, and
running the retry would measure that configuration twice.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import write_trial

NUDGE_AFTER = 3  # repeat suggestions in a row after which an unmeasured configuration is queued
MAX_IN_A_ROW = 50  # repeats in a row despite those: the sweep stops (queued ones realised as measured ones)
EXHAUSTED = ("every configuration of the space was measured or left out without a measurement (the reasons are "
             "on the trials): nothing is left to run")


def checked(record: TrialRecord) -> bool:
    """Whether a trial about to run is first looked up among earlier measurements: all but the re-measurements
    made on purpose (a retry is looked up: its dead trial may have held a suggestion not yet answered)."""
    return record.remeasure_of is None and record.again_of is None


def earlier(trials: Iterable[TrialRecord], config: Mapping[str, Any] | None, flagged: set[int], asking: int,
            command: Callable[[Mapping[str, Any]], Any]) -> TrialRecord | None:
    """The latest measurement of this configuration (`command`: a key equal for configurations that run alike),
    one not flagged by the drift anchor first; else a trial of it that another worker is running (other than
    `asking`, the trial being decided)."""
    if config is None:
        return None
    trials = list(trials)
    key = command(config)
    same = [t for t in trials if t.is_finished and t.config is not None and command(t.config) == key]
    if same:
        return max(same, key=lambda t: (t.number not in flagged, t.number))
    return next((t for t in trials if t.state == TrialState.RUNNING and t.number != asking and t.config is not None
                 and command(t.config) == key and t.repeat_of is None), None)


def answer(study: optuna.Study, trial: optuna.Trial, source: TrialRecord) -> None:
    """Tell `trial` the state and values of `source` without running anything, tagged as its repeat."""
    running = source.state == TrialState.RUNNING
    write_trial(trial, repeat_of=source.number, unmeasured=True, outcome="repeat",
                reason=f"configuration of trial {source.number}, which another worker is measuring: not run twice"
                if running else f"configuration already measured in trial {source.number}: answered with its "
                "values, not run again")
    for key, value in source.constraints.items():
        trial.set_constraint(key, value)
    if source.state == TrialState.COMPLETE:
        study.tell(trial, list(source.values) if len(source.values) > 1 else source.values[0])
    else:
        study.tell(trial, state=TrialState.PRUNED if running else source.state)


def _draw(dist: BaseDistribution, rng: random.Random) -> Any:
    if isinstance(dist, IntDistribution):
        return rng.randrange(dist.low, dist.high + 1, dist.step)
    if isinstance(dist, FloatDistribution):
        return rng.uniform(dist.low, dist.high)
    assert isinstance(dist, CategoricalDistribution)
    return rng.choice(dist.choices)


def unmeasured(dists: dict[str, BaseDistribution], trials: Iterable[TrialRecord], rng: random.Random,
               tries: int = 500) -> dict[str, Any] | None:
    """Parameters drawn at random that no trial has measured, is running or left out (recorded without a
    measurement: predicted over the budget or slower, refused, answered as a repeat); None when `tries` draws find
    none: for a finite space that small, every configuration was measured or left out."""
    seen = {repr(sorted(t.params.items())) for t in trials
            if t.state.is_finished() or t.state in (TrialState.RUNNING, TrialState.WAITING)}
    for _ in range(tries):
        params = {name: _draw(d, rng) for name, d in dists.items()}
        if repr(sorted(params.items())) not in seen:
            return params
    return None


def exhausted(dists: dict[str, BaseDistribution], trials: Iterable[TrialRecord]) -> bool:
    """Whether unmeasured() finds nothing left. It draws from a stream of its own, so checking after every skipped
    trial leaves the sweep's stream, which picks the configurations queued after repeats, as the seed set it."""
    return unmeasured(dists, trials, random.Random(0)) is None
