"""No accidental repeats, on the replay engine (trials answered from a table in milliseconds): a configuration
already measured is answered from its measurement without running or spending budget, also across SIGKILLs."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autoinfer.campaign.spec import load_campaign
from autoinfer.store import trials as store
from autoinfer.store.trials import Store
from autoinfer.sweep import runner
from autoinfer.sweep.repeats import checked, exhausted

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]


def replay_campaign(tmp_path: Path, *, threads: int, trials: int, sampler: str = "tpe") -> Path:
    """threads × 2 ubatch rows; the speed grows with both, so TPE keeps coming back to the fast corner."""
    table = tmp_path / "table.csv"
    rows = ["threads,ubatch,tg,pp,rss_mib"]
    rows += [f"{t},{u},{10 + t + u / 256:.2f},{100 + 5 * t:.1f},{500 + u}" for t in range(1, threads + 1)
             for u in (128, 512)]
    table.write_text("\n".join(rows) + "\n")
    (tmp_path / "m").write_text("replay label\n")
    path = tmp_path / "repeats.yaml"
    path.write_text(yaml.safe_dump({
        "name": "repeats", "engine": "replay", "engine_options": {"table": str(table), "seed": 1}, "model": "m",
        "space": {"threads": {"low": 1, "high": threads}, "ubatch": [128, 512]},
        "budget": {"trials": trials}, "measure": {"repetitions": 3, "max_cv": None},
        "sampler": {"name": sampler, "seed": 3},
        "idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"enabled": False},
    }))
    return path


def complete(db: Path) -> int:
    """COMPLETE trials, read through a read-only connection (watching never writes to the store)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet, or locked for a moment
        return 0


def measured_configs(trials) -> Counter:
    """How often each configuration was measured, re-measurements made on purpose (drift, the incumbent) aside."""
    return Counter(repr(sorted(t.config.items())) for t in trials if t.is_finished and checked(t))


def test_a_space_smaller_than_the_budget_is_measured_once_per_configuration(tmp_path):
    campaign = load_campaign(replay_campaign(tmp_path, threads=2, trials=10))  # 4 configurations, 10 trials
    study = runner.sweep(campaign, progress=False).study
    trials = Store(study).records()
    counts = measured_configs(trials)
    assert len(counts) == 4 and set(counts.values()) == {1}, counts
    repeats = [t for t in trials if t.repeat_of is not None]
    assert repeats, "the sampler never suggested a measured configuration again (the test proves nothing)"
    for t in repeats:
        source = trials[t.repeat_of]
        assert t.config == source.config and source.is_finished
        assert t.values == source.values and not t.is_finished  # TPE told the known value; no budget
        assert t.outcome == "repeat"


def test_a_sweep_killed_five_times_ends_with_distinct_measured_configurations(tmp_path):
    path = replay_campaign(tmp_path, threads=16, trials=14)  # 32 configurations
    env = {**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results")}
    url = f"sqlite:///{tmp_path / 'results' / 'autoinfer.db'}"
    db = tmp_path / "results" / "autoinfer.db"
    for target in (2, 4, 6, 8, 10):  # killed once that many trials are complete, wherever the sweep then is
        proc = subprocess.Popen([*CLI, "sweep", str(path), "--quiet"], cwd=tmp_path, env=env,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and complete(db) < target:
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, "the sweep ended before it was killed"
    done = subprocess.run([*CLI, "sweep", str(path), "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                          check=False, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = Store(store.load_study("repeats", url)).records()
    counts = measured_configs(trials)
    assert len(counts) == sum(counts.values()), counts  # no configuration measured twice, retries included
    counted = [t for t in trials if t.is_finished]
    assert len(counted) == 14  # the budget, exactly: retries replace the trials the kills interrupted
    again = [t for t in counted if t.again_of is not None]  # the search measured an incumbent again on purpose
    assert len({repr(sorted(t.config.items())) for t in counted}) == 14 - len(again)
    assert all(trials[t.again_of].params == t.params for t in again)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for t in trials:  # every trial the kills interrupted is failed, tagged, and its configuration measured
        if t.stale and t.params and t.repeat_of is None:
            assert any(r.retry_of == t.number for r in trials)  # queued again: measured, or answered from a trial
            assert any(r.is_finished and r.params == t.params for r in trials)  # that measured it


def test_whether_a_space_is_exhausted_is_told_without_the_sweeps_random_stream():
    """After every skipped trial the sweep asks whether anything is left to measure; that check drew from the stream
    that picks the configurations queued after repeats, so each skip changed what the sweep queued later. It takes
    no stream now, and still tells one configuration left from none."""
    dists = {"threads": IntDistribution(1, 2), "ubatch": CategoricalDistribution([128, 512])}
    study = optuna.create_study()
    for threads, ubatch in ((1, 128), (1, 512), (2, 128)):
        study.add_trial(create_trial(params={"threads": threads, "ubatch": ubatch}, distributions=dists, value=1.0))
    assert not exhausted(dists, Store(study).records())
    study.add_trial(create_trial(params={"threads": 2, "ubatch": 512}, distributions=dists, value=1.0))
    assert exhausted(dists, Store(study).records())


def test_a_retry_of_a_suggestion_already_measured_is_answered_not_run_again(tmp_path, monkeypatch):
    """A process killed after the sampler suggested a measured configuration, before that was answered, leaves a
    trial RUNNING with its parameters; the retry queued for it is looked up like a suggestion, not measured twice."""
    monkeypatch.setenv("AUTOINFER_RESULTS", str(tmp_path / "results"))
    path = replay_campaign(tmp_path, threads=2, trials=2)
    study = runner.sweep(load_campaign(path), progress=False).study
    first = Store(study).records()[0]
    study.enqueue_trial(dict(first.params))
    killed = study.ask()  # the dead process's trial: suggested, never answered
    killed.suggest_int("threads", 1, 2)
    killed.suggest_categorical("ubatch", [128, 512])
    assert killed.params == first.params
    path.write_text(path.read_text().replace("trials: 2", "trials: 3"))
    trials = Store(runner.sweep(load_campaign(path), progress=False).study).records()
    assert trials[killed.number].stale
    retry = next(t for t in trials if t.retry_of == killed.number)
    assert retry.repeat_of == first.number and not retry.is_finished
    counts = measured_configs(trials)
    assert len(counts) == sum(counts.values()) == 3, counts
