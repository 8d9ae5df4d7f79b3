"""Several workers on one study: Optuna's RDB storage on PostgreSQL is the queue, nothing else.

- Every worker is an ordinary sweep on a shared storage URL. Optuna hands out trials (and the re-queued
  configurations of dead workers) through the database.
- Liveness: each running trial sends a heartbeat (RDBStorage heartbeat_interval); a trial whose heartbeat stopped
  for the grace period belongs to a dead worker, and the next worker that asks for a trial fails it and queues its
  configuration again, through the same re-queue the runner uses for a SQLite study after a crash (there, one
  worker per study makes every RUNNING trial stale).
- Budget: "count the trials finished or running, then ask" is a race between workers; both steps run under a
  PostgreSQL advisory lock held per study, so the count every worker sees includes every trial another worker
  asked for, and the campaign never runs more trials than its budget.
- `worker --gpus 0,1` starts one worker per GPU, each with CUDA_VISIBLE_DEVICES set (`--gpus 0+1,2+3`: one per
  group of GPUs); measurements of one host are serialised by autoinfer.coordination.hostlock, and hardware classes by
  autoinfer.coordination.hardware.
- Wall time: `budget.wall_s` is the campaign's, not each worker's (store.elapsed_s: the union of every trial's
  interval and the asking worker's session).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import Workers
from autoinfer.coordination import hardware
from autoinfer.errors import UserError
from autoinfer.measure.host import Fingerprint
from autoinfer.paths import STORAGE_ENV
from autoinfer.store import optuna_adapter as adapter
from autoinfer.store import trials as store
from autoinfer.store.records import TrialRecord, waiting_remeasurements
from autoinfer.store.redact import redact, redact_url
from autoinfer.store.trials import Store, write_trial
from autoinfer.store.urls import check_url, driver_url, is_shared

_LOCK_SPACE = 0x61757469  # first key of every advisory lock autoinfer takes ("auti")
_SCHEMA_LOCK = 0  # second key while creating Optuna's tables


def _engine(url: str) -> Any:
    """A connection-per-use SQLAlchemy engine for the lock connections; UserError when the driver is missing."""
    import sqlalchemy

    try:
        return sqlalchemy.create_engine(driver_url(url), poolclass=sqlalchemy.pool.NullPool)
    except ImportError as exc:
        raise UserError(f"cannot open storage {redact_url(url)!r}: {redact(str(exc))}; install the driver with "
                        "pip install 'autoinfer[postgres]'") from None


@contextmanager
def _advisory_lock(engine: Any, key: int) -> Iterator[None]:
    """A session-level PostgreSQL advisory lock; the server drops it if this process dies."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        conn = engine.connect()
    except SQLAlchemyError as exc:
        url = engine.url.render_as_string(hide_password=True)
        raise UserError(f"cannot open storage {redact_url(url)!r}: {redact(str(exc).splitlines()[0])}") from None
    with conn:
        conn.execute(text("SELECT pg_advisory_lock(:a, :b)"), {"a": _LOCK_SPACE, "b": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:a, :b)"), {"a": _LOCK_SPACE, "b": key})
            conn.commit()


def _study_key(name: str) -> int:
    """An int4 advisory-lock key for a study name, never the schema key (a collision only serialises two studies)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF or 1


def campaign_storage(url: str, workers: Workers) -> optuna.storages.BaseStorage:
    """The storage a sweep or worker runs a study on: on PostgreSQL with heartbeats, its tables created by one worker
    at a time (the first to connect creates them; the others would race it)."""
    check_url(url)
    if not is_shared(url):
        return store.storage_for(url)
    import sqlalchemy

    engine = _engine(url)
    try:
        with _advisory_lock(engine, _SCHEMA_LOCK):
            return store.storage_for(url, heartbeat_s=workers.heartbeat_s, grace_s=workers.grace)
    except sqlalchemy.exc.SQLAlchemyError as exc:  # the lock's own connection: a wrong password, no server
        raise UserError(f"cannot open storage {redact_url(url)!r}: {redact(str(exc).splitlines()[0])}") from None
    finally:
        engine.dispose()


@contextmanager
def serialized(study_or_url: optuna.Study | str, name: str | None = None) -> Iterator[None]:
    """Run a block alone among the workers of a study (no-op where only one worker can exist)."""
    if isinstance(study_or_url, str):
        if not is_shared(study_or_url):
            yield
            return
        check_url(study_or_url)
        engine = _engine(study_or_url)
        try:
            with _advisory_lock(engine, _study_key(name or "")):
                yield
        finally:
            engine.dispose()
        return
    backend = adapter.backend(study_or_url)
    if not isinstance(backend, optuna.storages.RDBStorage) or not is_shared(backend.url):
        yield
        return
    with _advisory_lock(backend.engine, _study_key(study_or_url.study_name)):
        yield


def reclaim_stale(study: optuna.Study, stale: list[TrialRecord] | None = None) -> int:
    """Fail the trials a dead process left RUNNING (all of them, or `stale`: those whose heartbeat stopped on a
    shared storage) and queue their configurations again.

    Not optuna.storages.fail_stale_trials with RetryHeartbeatStaleTrialCallback: that fails a trial before its
    callback runs, after which Optuna refuses the stale flag that keeps it out of the budget, and the callback
    re-queues answered repeats too (tests/store/test_optuna_adapter.py shows both)."""
    study_store = Store(study)
    stale = study_store.records(states=(TrialState.RUNNING,)) if stale is None else stale
    requeued = 0
    for t in stale:
        chosen = bool(t.params)  # a process killed between ask() and its first suggest left nothing to re-run
        repeat = t.repeat_of  # answered from an earlier trial: nothing was to run
        reason = ("re-queued" if chosen and repeat is None else f"a repeat of trial {repeat}; nothing to re-run"
                  if chosen else "before its configuration was chosen; nothing to re-run")
        chosen = chosen and repeat is None
        failed = study_store.fail(t, stale=True, outcome="crash",
                             reason=f"the sweep process died while this trial ran; {reason}")
        if failed and chosen:  # not failed: its worker finished it after all
            study_store.enqueue(dict(t.params), retry_of=t.number)
            requeued += 1
    return requeued


def _used(trials: list[TrialRecord]) -> int:
    """How many of the budget's trials these use up."""
    return sum(1 for t in trials if t.uses_budget)


def last_to_finish(study: optuna.Study, note: Callable[[str], None]) -> bool:
    """True for the worker that ends a study's trials: no other worker still runs one (call it serialized)."""
    running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    if running:
        note(f"{running} trial(s) still running on other workers; the last worker to finish runs the confirmation")
    return running == 0


class SharedBudget:
    """Hands out trials while the campaign's budget has room, across every worker of the study.

    Also keeps the heartbeat of the trial it handed out last (until the next ask or the end of the sweep) and
    records on each trial which host and hardware class measured it.
    """

    def __init__(self, study: optuna.Study, trials: int, machine: Fingerprint,
                 note: Callable[[str], None] = lambda _: None) -> None:
        self.study = study
        self.trials = trials
        self.machine = machine
        self.note = note
        self._beat: adapter.BaseHeartbeatThread | None = None

    def ask(self, dists: dict[str, Any]) -> optuna.Trial | None:
        """The next trial, or None once finished trials fill the budget.

        While the budget is full only because other workers still run trials, this waits: one of those may belong
        to a dead worker, and its re-queued configuration must still be measured by someone.
        """
        self._stop_beat()
        while True:
            with serialized(self.study):
                trials = self._reclaimed_trials()
                running = sum(1 for t in trials if t.state == TrialState.RUNNING)
                if _used(trials) < self.trials or waiting_remeasurements(trials):
                    with warnings.catch_warnings():  # ask-and-tell with heartbeats is this class's own doing
                        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
                        trial = self.study.ask(dists)
                    self._beat = adapter.start_heartbeat(self.study, trial)
                    write_trial(trial, host=hardware.trial_host(self.machine))
                    return trial
            if not running:
                return None
            time.sleep(adapter.heartbeat_interval(self.study) or 1)

    def room(self) -> bool:
        """Whether the budget has room for one more trial now. Call it serialized, with the queueing it decides: a
        trial queued with room is the next one any worker asks for; one queued without it would be left waiting.
        A trial already queued (by another worker, say) takes its place as if it ran."""
        trials = Store(self.study).records()
        queued = sum(1 for t in trials if t.state == TrialState.WAITING and not t.is_remeasurement)
        return _used(trials) + queued < self.trials

    def _reclaimed_trials(self) -> list[TrialRecord]:
        """The study's trials after failing and re-queueing those of dead workers."""
        study_store = Store(self.study)
        stale = study_store.stale_running()
        requeued = reclaim_stale(self.study, stale) if stale else 0
        if requeued:
            self.note(f"{requeued} trial(s) of a worker whose heartbeat stopped: failed and re-queued")
        return study_store.records()

    def _stop_beat(self) -> None:
        if self._beat is not None:
            self._beat.join()
            self._beat = None

    def __enter__(self) -> "SharedBudget":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_beat()


def parse_gpus(text: str) -> list[str]:
    """'0,1' → ['0', '1'] (a worker each); '0+1,2+3' → ['0,1', '2,3'] (a worker per group, which searches the
    multi-GPU split knobs). UserError for anything but distinct GPU indices or UUIDs."""
    groups = [[g.strip() for g in v.split("+")] for v in text.split(",") if v.strip()]
    flat = [g for group in groups for g in group]
    if not flat or len(set(flat)) != len(flat) or not all(g.isdigit() or g.startswith(("GPU-", "MIG-"))
                                                          for g in flat):
        raise UserError(f"--gpus {text!r}: give distinct GPU indices or UUIDs separated by commas, e.g. --gpus 0,1 "
                        "(a worker per GPU) or --gpus 0+1,2+3 (a worker per group of GPUs)")
    return [",".join(group) for group in groups]


def start_per_gpu(gpus: list[str], worker_args: list[str], storage: str) -> int:
    """One `autoinfer worker` child per GPU (or group), each seeing only its GPUs; waits for all, returns the worst
    exit code. The storage URL reaches them in the environment (readable only by this user), never in their argv,
    where `ps` would show its password to everyone.

    Ctrl-C reaches the children from the terminal (same process group); SIGTERM is passed on to them. A child that
    stops mid-trial leaves the trial to the heartbeat: another worker fails it and runs its configuration again.
    """
    children = []
    for gpu in gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", STORAGE_ENV: storage}
        argv = [sys.executable, "-c", "from autoinfer.cli import main; main()", "worker", *worker_args]
        children.append(subprocess.Popen(argv, env=env))

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
    try:
        codes = [child.wait() for child in children]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return max(codes, key=abs)
