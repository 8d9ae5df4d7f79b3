"""Every use of Optuna's private API, in one place, for the Optuna versions pyproject.toml declares.

Optuna (5.x) exposes no public way to do four things several workers on one study need: reach a study's storage
(to write to a trial another process owns and to read a trial's state as stored, not as this process cached it),
identify a trial in it, list the running trials whose heartbeat stopped (`fail_stale_trials` fails them but does
not say which, and autoinfer re-queues them with its own record of why), and keep a heartbeat for a trial run
with ask-and-tell (`study.optimize` does this internally). tests/store/test_optuna_adapter.py exercises each
function on a real storage, so an Optuna release that moves one fails there, not in a user's overnight sweep.
"""

from __future__ import annotations

import optuna
from optuna.storages._heartbeat import BaseHeartbeatThread, get_heartbeat_thread, is_heartbeat_enabled
from optuna.trial import FrozenTrial

#: The Optuna versions this module was written against: [low, high), as in pyproject.toml.
SUPPORTED = ((5, 0), (6, 0))


def storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage


def backend(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage under Optuna's in-process cache (an RDBStorage is wrapped in one)."""
    store = storage(study)
    return getattr(store, "_backend", store)


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    return trial._trial_id


def stored_trial(study: optuna.Study, trial: FrozenTrial | optuna.Trial) -> FrozenTrial:
    """The trial as the storage holds it now (another worker may have failed it)."""
    return storage(study).get_trial(trial_id(trial))


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Running trials whose heartbeat stopped for the grace period (an RDB storage with heartbeats)."""
    return set(backend(study)._get_stale_trial_ids(study._study_id))


def heartbeat_interval(study: optuna.Study) -> int | None:
    store = backend(study)
    return store.get_heartbeat_interval() if isinstance(store, optuna.storages.RDBStorage) else None


def start_heartbeat(study: optuna.Study, trial: optuna.Trial) -> BaseHeartbeatThread:
    """Beat once now (before another worker can look) and keep beating until the thread is joined."""
    store = storage(study)
    if is_heartbeat_enabled(store):
        store.record_heartbeat(trial_id(trial))
    beat = get_heartbeat_thread(trial_id(trial), store)
    beat.start()
    return beat
