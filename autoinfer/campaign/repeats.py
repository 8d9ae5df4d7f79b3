"""No accidental repeats: a configuration already measured runs again only as a deliberate, tagged re-measurement.

A sampler proposes a configuration it has seen whenever the space is small or its model is sure, and after a
crash a resumed study can do the same. Running it again spends budget on nothing new, and an untagged duplicate
reads like a new result. Such a suggestion is answered without running anything: the trial is told the earlier
measurement's values (so TPE stays informed), tagged `repeat_of=N`, and recorded as unmeasured, which costs no
budget. Re-measurements the project makes on purpose carry their own tag (drift: `remeasure_of`, a dead process's
trial: `retry_of`) and run as usual.
"""

from __future__ import annotations

from typing import Any, Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoinfer.campaign import store

REPEAT_ATTR = "repeat_of"
DELIBERATE = ("remeasure_of", "retry_of")  # tags of re-measurements made on purpose
MAX_IN_A_ROW = 20  # repeat suggestions in a row after which the space counts as exhausted


def deliberate(user_attrs: dict[str, Any]) -> bool:
    return any(key in user_attrs for key in DELIBERATE)


def earlier(trials: Iterable[FrozenTrial], config: dict[str, Any], flagged: set[int]) -> FrozenTrial | None:
    """The latest measurement of exactly this configuration, one not flagged by the drift anchor first."""
    same = [t for t in trials if store.is_finished(t) and t.user_attrs.get("config") == config]
    if not same:
        return None
    return max(same, key=lambda t: (t.number not in flagged, t.number))


def answer(study: optuna.Study, trial: optuna.Trial, source: FrozenTrial) -> None:
    """Tell `trial` the state and values of `source` without running anything, tagged as its repeat."""
    trial.set_user_attr(REPEAT_ATTR, source.number)
    trial.set_user_attr(store.UNMEASURED_ATTR, True)
    trial.set_user_attr("outcome", "repeat")
    trial.set_user_attr("reason", f"configuration already measured in trial {source.number}: answered with its "
                                  "values, not run again")
    for key, value in source.constraints.items():
        trial.set_constraint(key, value)
    if source.state == TrialState.COMPLETE:
        study.tell(trial, source.values if len(source.values) > 1 else source.values[0])
    else:
        study.tell(trial, state=source.state)
