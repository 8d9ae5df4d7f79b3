"""Each Optuna-private call autoinfer makes, on a real storage, for the Optuna version installed."""

from __future__ import annotations

import re
import time
import tomllib
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autoinfer.store import optuna_adapter as adapter
from autoinfer.store.trials import Store, write_trial

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_declared_optuna_range_is_the_adapters():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("optuna"))
    low = re.fullmatch(r"optuna>=(\d+)\.(\d+),<(\d+)", spec).groups()
    assert ((int(low[0]), int(low[1])), (int(low[2]), 0)) == adapter.SUPPORTED, spec
    installed = tuple(int(p) for p in optuna.__version__.split(".")[:2])
    assert adapter.SUPPORTED[0] <= installed < adapter.SUPPORTED[1], optuna.__version__


def test_heartbeats_stale_trials_and_failing_a_trial_of_another_process(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="s", storage=storage)
    assert adapter.heartbeat_interval(study) == 1
    trial = study.ask()
    beat = adapter.start_heartbeat(study, trial)
    assert adapter.stored_trial(study, trial).state == TrialState.RUNNING
    assert adapter.trial_id(trial) not in adapter.stale_trial_ids(study)  # beating
    beat.join()  # its worker "died": no more beats
    time.sleep(3.5)
    assert adapter.trial_id(trial) in adapter.stale_trial_ids(study)
    running = Store(study).records()[0]
    assert Store(study).fail(running, reason="gone")  # through the storage: the trial is another process's
    stored = adapter.stored_trial(study, trial)
    assert stored.state == TrialState.FAIL and stored.user_attrs["reason"] == "gone"
    assert not Store(study).fail(running, reason="again")  # already finished: nothing written
    assert adapter.stored_trial(study, trial).user_attrs["reason"] == "gone"


def test_an_in_memory_study_has_no_heartbeat():
    study = optuna.create_study()
    assert adapter.heartbeat_interval(study) is None
    assert isinstance(adapter.backend(study), optuna.storages.InMemoryStorage)


def test_optunas_stale_trial_api_cannot_record_why_it_failed_a_trial(tmp_path):
    """Why coordination.worker.reclaim_stale fails stale trials itself (stale_trial_ids, Store.fail) rather than through
    optuna.storages.fail_stale_trials with RetryHeartbeatStaleTrialCallback: fail_stale_trials fails the trial before
    its callback runs, and Optuna then refuses every write to it, so the stale flag and reason that keep the trial out
    of the budget cannot be recorded; and the retry callback re-queues every stale trial with all of its attributes,
    an answered repeat (repeat_of, outcome "repeat": never to be run) included. When this test fails, Optuna lets the
    trial be annotated and reclaim_stale can use the public API (a SQLite study, without heartbeats, still needs its
    own: there every RUNNING trial of a resumed sweep is stale)."""
    refused: list[Exception] = []

    def on_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        try:
            adapter.storage(study).set_trial_user_attr(adapter.trial_id(trial), "stale", True)
        except optuna.exceptions.UpdateFinishedTrialError as exc:
            refused.append(exc)
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, trial)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeats and stale-trial handling are experimental in Optuna
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}", heartbeat_interval=1, grace_period=1,
                                             heartbeat_stale_trial_callback=on_stale)
        study = optuna.create_study(study_name="s", storage=storage)
        trial = study.ask({"x": optuna.distributions.IntDistribution(0, 2)})
        write_trial(trial, repeat_of=0, outcome="repeat")  # its worker died while answering it as a repeat
        adapter.start_heartbeat(study, trial).join()
        time.sleep(2.5)
        optuna.storages.fail_stale_trials(study)
    dead, retry = Store(study).records()
    assert dead.state == TrialState.FAIL and not dead.stale and len(refused) == 1
    assert retry.state == TrialState.WAITING and (retry.repeat_of, retry.outcome) == (0, "repeat")
