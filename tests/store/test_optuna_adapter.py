"""Each Optuna-private call autoinfer makes, on a real storage, for the Optuna version installed."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autoinfer.store import optuna_adapter as adapter

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
    frozen = study.get_trials(deepcopy=False)[0]
    assert adapter.fail_with(study, frozen, {"reason": "gone"})
    stored = adapter.stored_trial(study, trial)
    assert stored.state == TrialState.FAIL and stored.user_attrs["reason"] == "gone"
    assert not adapter.fail_with(study, frozen, {"reason": "again"})  # already finished: nothing written
    assert adapter.stored_trial(study, trial).user_attrs["reason"] == "gone"


def test_an_in_memory_study_has_no_heartbeat():
    study = optuna.create_study()
    assert adapter.heartbeat_interval(study) is None
    assert isinstance(adapter.backend(study), optuna.storages.InMemoryStorage)
