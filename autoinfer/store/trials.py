"""The study store: Optuna storage is the source of truth; per-trial artifacts live beside it on disk.

Everything `status`, `export` and `analyze` show is read back from here, so a campaign can be inspected,
resumed or exported from any process.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoinfer import atomic
from autoinfer.engines.base import Measurement, Outcome, TrialConfig
from autoinfer.errors import UserError
from autoinfer.paths import default_storage
from autoinfer.store.redact import redact, redact_url
from autoinfer.store.urls import MEMORY_STORAGE, driver_url

CAMPAIGN_ATTR = "campaign"
UNMEASURED_ATTR = "unmeasured"  # recorded without running: costs no measurement, not counted against the budget
AGAIN_ATTR = "again_of"  # measured again on purpose by the search: a lucky first measurement is checked
REPEAT_ATTR = "repeat_of"  # answered with an earlier trial's measurement, not run
REMEASURE_ATTR = "remeasure_of"  # queued again because the drift anchor flagged its measurement
RETRY_ATTR = "retry_of"  # queued again because the worker that ran it died (no heartbeat)
#: Why a trial exists when it is not the search's own suggestion: each names the trial it measures again or answers.
ORIGIN_ATTRS = (REMEASURE_ATTR, RETRY_ATTR, AGAIN_ATTR, REPEAT_ATTR)
STALE_ATTR = "stale"  # a trial that was RUNNING when its process died; its configuration was re-queued
#: Study attribute: the settings the engine imposed on every trial and why (repack off after a crashing smoke run);
#: trial attribute: those settings.
DECISIONS_ATTR = "imposed_settings"
DRIFT_FLAGGED_ATTR = "drift_flagged"  # study attr: trials measured while the drift anchor had moved (re-queued)


def storage_for(url: str | None) -> optuna.storages.BaseStorage:
    """An RDB storage for the URL (default: the SQLite file under results/)."""
    url = url or default_storage()
    if url == MEMORY_STORAGE:
        return optuna.storages.InMemoryStorage()
    try:
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


def outcome_of(trial: FrozenTrial) -> str:
    if trial.state == TrialState.RUNNING:
        return "running"
    if trial.state == TrialState.WAITING:
        return "waiting"
    return str(trial.user_attrs.get("outcome", "fail" if trial.state == TrialState.FAIL else "unknown"))


def is_finished(trial: FrozenTrial) -> bool:
    """Counts against the trial budget: ended, not a stale trial whose configuration was re-queued, and not one
    recorded without a measurement (predicted over the memory budget, over max_kld, refused by the engine)."""
    return (trial.state.is_finished() and not trial.user_attrs.get(STALE_ATTR)
            and not trial.user_attrs.get(UNMEASURED_ATTR))


def is_remeasurement(trial: FrozenTrial | optuna.Trial) -> bool:
    """A configuration queued again because the drift anchor flagged its measurement: it is measured before the
    campaign ends and does not count against the trial budget."""
    return REMEASURE_ATTR in trial.user_attrs


def waiting_remeasurements(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.state == TrialState.WAITING and is_remeasurement(t)]


def is_feasible_ok(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("outcome") == Outcome.OK.value
        and all(v <= 0 for v in trial.constraints.values())
    )


def config_of(trial: FrozenTrial) -> TrialConfig:
    return TrialConfig.from_params(trial.user_attrs["config"])


def samples_of(trial: FrozenTrial, kind: str) -> list[float]:
    return [float(v) for v in trial.user_attrs.get(f"{kind}_samples", [])]


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


def kld_of(trial: FrozenTrial | optuna.Trial) -> list[float]:
    """The trial's model-file KLD as a one-value sample list (empty when its file has no quality measured)."""
    kld = trial.user_attrs.get("kld")
    return [float(kld)] if kld is not None else []


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


def measurement_attrs(m: Measurement) -> dict[str, Any]:
    """The user attributes a trial carries (the store's schema)."""
    return {
        "outcome": m.outcome.value,
        "reason": m.reason[:2000],
        "engine_cmd": list(m.engine_cmd),
        "tg_samples": list(m.tg_samples),
        "pp_samples": list(m.pp_samples),
        "vram_peak_mib": m.vram_peak_mib,
        "vram_per_gpu_mib": list(m.vram_per_gpu_mib),
        "rss_peak_mib": m.rss_peak_mib,
        "wall_s": m.wall_s,
        "engine_s": m.engine_s,
        "metrics": json.loads(json.dumps(m.metrics, default=str)),
        "env": json.loads(json.dumps(m.env, default=str)),
    }


@dataclass(frozen=True)
class Best:
    trial: FrozenTrial
    config: TrialConfig
    value: float
    confirmation: dict[str, Any] | None = None  # the study's `confirmed` record when this is its recommendation
