"""The study store: Optuna storage is the source of truth; per-trial artifacts live beside it on disk.

Everything `status`, `export` and `analyze` show is read back from here as records (autoinfer.store.records), so a
campaign can be inspected, resumed or exported from any process.
"""

from __future__ import annotations

import json
import math
import shlex
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from autoinfer import atomic
from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.errors import UserError
from autoinfer.paths import default_storage
from autoinfer.store import optuna_adapter as adapter
from autoinfer.store.records import Confirmation, StudyRecord, TrialRecord, attrs_of, study_attrs_of
from autoinfer.store.redact import redact, redact_url
from autoinfer.store.urls import MEMORY_STORAGE, driver_url


def storage_for(url: str | None, *, heartbeat_s: int | None = None, grace_s: int | None = None) -> optuna.storages.BaseStorage:
    """An RDB storage for the URL (default: the SQLite file under results/); with heartbeat_s, one whose running
    trials send heartbeats and count as stale after grace_s of silence (several workers on PostgreSQL)."""
    url = url or default_storage()
    if url == MEMORY_STORAGE:
        return optuna.storages.InMemoryStorage()
    try:
        if heartbeat_s is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are the point
                return optuna.storages.RDBStorage(driver_url(url), engine_kwargs={"pool_pre_ping": True},
                                                  heartbeat_interval=heartbeat_s, grace_period=grace_s)
        return optuna.storages.RDBStorage(driver_url(url))
    except (ValueError, ImportError) as exc:
        raise UserError(f"cannot open storage {redact_url(url)!r}: {redact(str(exc))}") from None
    except Exception as exc:  # sqlalchemy connection errors
        raise UserError(f"cannot open storage {redact_url(url)!r}: {redact(str(exc).splitlines()[0])}") from None


def load_study(name: str | None, storage: str | None) -> optuna.Study:
    """An existing study; with no name, the only (or most recent) one in the storage."""
    store = storage_for(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    if not names:
        raise UserError(f"no study in {redact_url(storage or default_storage())}; run `autoinfer sweep` first")
    if name is None:
        name = names[-1]
    elif name not in names:
        raise UserError(f"no study {name!r} in {redact_url(storage or default_storage())}; studies there: {', '.join(names)}")
    return optuna.load_study(study_name=name, storage=store)


def flagged_trials(study: optuna.Study) -> set[int]:
    """Trial numbers measured while the anchor showed drift (sweep/drift.py): excluded from the best, the
    confirmation and the prompt-faster alternative."""
    return set(Store(study).study_record().drift_flagged)


def score(samples: dict[str, list[float]], weights: dict[str, float]) -> float | None:
    """The objective: weighted geometric mean of the medians, so tg and pp mix regardless of their scales."""
    import statistics

    total = 0.0
    for kind, w in weights.items():
        if kind == "kld":  # quality penalty exp(-w·KLD), where the caller knows the trial's KLD
            total -= w * (samples.get("kld") or [0.0])[0]
            continue
        values = samples.get(kind) or []
        if not values:
            return None
        med = statistics.median(values)
        if med <= 0:
            return None
        total += w * math.log(med)
    return math.exp(total)


def elapsed_s(study: optuna.Study, since: datetime | None = None) -> float:
    """Wall time the campaign has used, on any worker: the union of its trials' start–end intervals (a running
    trial ends now) and of [since, now] for the calling worker's session. Overlapping workers count once; time
    between resumed sessions does not count."""
    now = datetime.now()
    spans = [(t.datetime_start, t.datetime_complete or now)
             for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
    if since is not None:
        spans.append((since, now))
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += (end - start).total_seconds()
            reach = end
        elif end > reach:
            total += (end - reach).total_seconds()
            reach = end
    return total


def write_run_files(folder: Path, m: Measurement) -> Path:
    """stdout, stderr, raw engine output and the command line of one engine run, as files."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_text(folder / "stdout.txt", m.stdout, errors="replace")
    atomic.write_text(folder / "stderr.txt", m.stderr, errors="replace")
    atomic.write_text(folder / "raw_output.txt", m.raw_output, errors="replace")
    atomic.write_text(folder / "command.txt", shlex.join(m.engine_cmd) + "\n" if m.engine_cmd else "")
    return folder


def measurement_fields(m: Measurement) -> dict[str, Any]:
    """The TrialRecord fields a measurement fills."""
    return {
        "outcome": m.outcome.value,
        "reason": m.reason[:2000],
        "engine_cmd": tuple(m.engine_cmd),
        "tg_samples": m.tg_samples,
        "pp_samples": m.pp_samples,
        "vram_peak_mib": m.vram_peak_mib,
        "vram_per_gpu_mib": tuple(m.vram_per_gpu_mib),
        "rss_peak_mib": m.rss_peak_mib,
        "wall_s": m.wall_s,
        "engine_s": m.engine_s,
        "metrics": json.loads(json.dumps(m.metrics, default=str)),
        "env": json.loads(json.dumps(m.env, default=str)),
        **({"stand_in": True} if m.stand_in else {}),  # only where it is: a measured trial never is
    }


def write_trial(trial: optuna.Trial, **fields: Any) -> None:
    """Store TrialRecord fields on a trial this process is running."""
    for key, value in attrs_of(**fields).items():
        trial.set_user_attr(key, value)



def record_of(trial: FrozenTrial | optuna.Trial) -> TrialRecord:
    """The typed record of a stored trial, or of one this process is running."""
    return TrialRecord.from_trial(trial, trial.user_attrs)

class Store:
    """A study's records: the trials as TrialRecords, the study's own attributes as a StudyRecord, and every write
    of them (with write_trial for a trial this process runs)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def records(self, states: Sequence[TrialState] | None = None) -> list[TrialRecord]:
        return [record_of(t) for t in self.study.get_trials(deepcopy=False, states=states)]

    def record(self, number: int) -> TrialRecord:
        return record_of(self.study.get_trials(deepcopy=False)[number])

    def stored(self, trial: optuna.Trial) -> TrialRecord:
        """The trial as the storage holds it now (another worker may have failed it), not as this process cached it."""
        return record_of(adapter.stored_trial(self.study, trial))

    def enqueue(self, params: dict[str, Any], *, skip_if_exists: bool = False, **fields: Any) -> None:
        """Queue a configuration to be asked for next, with the TrialRecord fields that say why."""
        self.study.enqueue_trial(params, user_attrs=attrs_of(**fields), skip_if_exists=skip_if_exists)

    def add_trials(self, records: Sequence[TrialRecord]) -> None:
        """Finished trials made elsewhere (an import), stored as measured ones are."""
        self.study.add_trials([create_trial(
            state=r.state, values=list(r.values) if r.values is not None else None, params=dict(r.params),
            distributions=dict(r.distributions), user_attrs=r.to_attrs(), constraints=dict(r.constraints) or None)
            for r in records])

    def stale_running(self) -> list[TrialRecord] | None:
        """Running trials whose heartbeat stopped (a shared storage); None: no heartbeats, one worker per study."""
        if adapter.heartbeat_interval(self.study) is None:
            return None
        ids = adapter.stale_trial_ids(self.study)
        return [record_of(t) for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if adapter.trial_id(t) in ids]

    def fail(self, record: TrialRecord, **fields: Any) -> bool:
        """Store fields on a running trial this process does not own and fail it, through the storage (the trial's
        own handle belongs to another process); False when it finished meanwhile."""
        storage, tid = adapter.storage(self.study), adapter.trial_id(self.study.get_trials(deepcopy=False)[record.number])
        try:
            for key, value in attrs_of(**fields).items():
                storage.set_trial_user_attr(tid, key, value)
            storage.set_trial_state_values(tid, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

    def study_record(self) -> StudyRecord:
        return StudyRecord.from_attrs(self.study.user_attrs)

    def write_study(self, **fields: Any) -> None:
        """Store StudyRecord fields on the study."""
        for key, value in study_attrs_of(**fields).items():
            self.study.set_user_attr(key, value)


@dataclass(frozen=True)
class Best:
    """A configuration in the form the exporters render: its trial, configuration, objective value and, when it is
    the confirmed recommendation, the confirmation."""

    trial: TrialRecord
    config: TrialConfig
    value: float
    confirmation: Confirmation | None = None
