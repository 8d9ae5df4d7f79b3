"""Several workers on one PostgreSQL study: shared budget, heartbeat re-queue, hardware classes, SQLite refusal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autoinfer.campaign.spec import load_campaign
from autoinfer.coordination import hardware, worker
from autoinfer.errors import UserError
from autoinfer.store import trials as store
from autoinfer.store.trials import Store
from autoinfer.sweep.runner import sqlite_single_worker, sweep

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]


def replay_campaign(tmp_path: Path, trials: int, name: str = "shared") -> Path:
    """A replay campaign (trials answered from a table in milliseconds) with a 48-row table: more configurations
    than the largest budget here, since no configuration is measured twice."""
    table = tmp_path / "table.csv"
    rows = ["threads,ubatch,tg,pp,rss_mib"]
    rows += [f"{t},{u},{10 + t + u / 256:.2f},{100 + 5 * t:.1f},{500 + u}" for t in range(1, 17)
             for u in (128, 256, 512)]
    table.write_text("\n".join(rows) + "\n")
    (tmp_path / "m").write_text("replay label\n")  # the environment record fingerprints the model file it names
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "engine": "replay", "engine_options": {"table": str(table), "seed": 1}, "model": "m",
        "space": {"threads": {"low": 1, "high": 16}, "ubatch": [128, 256, 512]},
        "budget": {"trials": trials}, "measure": {"repetitions": 3, "max_cv": None},
        "idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"top_k": 2, "rounds": 2},
        "workers": {"heartbeat_s": 1, "grace_s": 30},  # nobody dies here: a late heartbeat on a busy host is no death
    }))
    return path


def start_worker(campaign: Path | None, study: str, url: str, env: dict[str, str] | None = None,
                 log: Path | None = None, quiet: bool = True) -> subprocess.Popen:
    argv = [*CLI, "worker", *([str(campaign)] if campaign else []), "--study", study, "--storage", url,
            *(["--quiet"] if quiet else [])]
    out = open(log, "w") if log else subprocess.PIPE
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def test_four_workers_run_the_budget_exactly_once(tmp_path, pg_url):
    campaign = replay_campaign(tmp_path, trials=40)
    workers = [start_worker(campaign, "shared", pg_url) for _ in range(4)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    if [w.returncode for w in workers] != [0] * 4:
        pytest.fail("\n\n".join(outputs))  # whole, where an assertion's explanation would be cut short

    study = store.load_study("shared", pg_url)
    every = Store(study).records()
    assert not [t for t in every if t.state in (TrialState.RUNNING, TrialState.WAITING)]  # nothing lost
    trials = [t for t in every if t.repeat_of is None]  # suggested again: answered, never run
    assert sum(t.is_finished for t in every) == 40 == len(trials)  # no overshoot
    again = [t for t in trials if t.again_of is not None]  # the search measured an incumbent again
    assert all(every[t.again_of].params == t.params for t in again)
    assert len({repr(sorted(t.params.items())) for t in trials}) == 40 - len(again)  # no other duplicate
    # measured to the end, or stopped at the first repetition far below the best (prune_below): the far corner of
    # the space is reached once the fast configurations have all been measured
    assert all((t.state, t.outcome) in ((TrialState.COMPLETE, "ok"), (TrialState.PRUNED, "pruned"))
               for t in trials)
    ran = [int(re.search(r"worker done: (\d+) trial", out).group(1)) for out in outputs]
    by_pid = Counter(t.host.pid for t in trials)
    assert sum(ran) == 40 and sorted(by_pid.values()) == sorted(r for r in ran if r)
    assert len(by_pid) >= 2, f"only one worker got trials: {ran}"
    # the last worker to finish confirmed once, on all 40 trials
    kept = Store(study).study_record()
    assert kept.confirmed.after_trials == 40
    assert kept.hardware_class.digest == hardware.hardware_class().digest


def bench_campaign(tmp_path: Path, model: Path, trials: int) -> Path:
    """A llama-bench campaign on the tiny model: a trial takes a few seconds on one core, long enough for two
    workers' trials to meet at the host lock."""
    campaign = tmp_path / "bench.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "bench", "engine": "llama-bench", "model": str(model),
        "space": {"n_gpu_layers": 0, "threads": 1, "ubatch": [8, 16, 32, 64, 128]},  # more than the budget
        "budget": {"trials": trials}, "measure": {"n_prompt": 64, "n_gen": 128, "repetitions": 3, "max_cv": None},
        "idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"enabled": False},
        "search": {"informed": False, "prune_below": None}, "workers": {"heartbeat_s": 1, "grace_s": 8},
    }))
    return campaign


def test_workers_on_one_host_measure_one_at_a_time(tmp_path, pg_url, llama_tools, tiny_model, monkeypatch):
    monkeypatch.setenv("AUTOINFER_HOST_LOCK", str(tmp_path / "host.lock"))
    campaign = bench_campaign(tmp_path, tiny_model, trials=4)
    workers = [start_worker(campaign, "bench", pg_url) for _ in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    trials = [t for t in Store(store.load_study("bench", pg_url)).records()
              if t.repeat_of is None]  # a configuration suggested again runs nothing
    assert len({t.host.pid for t in trials}) == 2
    windows = sorted((t.env["started_at"], t.env["started_at"] + t.env["duration_s"]) for t in trials)
    assert all(later[0] >= earlier[1] for earlier, later in zip(windows, windows[1:])), windows
    assert max(t.host_lock_wait_s for t in trials) > 0  # someone waited its turn


def test_killed_worker_trial_is_failed_by_heartbeat_and_rerun(tmp_path, pg_url, llama_tools, tiny_model, monkeypatch):
    monkeypatch.setenv("AUTOINFER_HOST_LOCK", str(tmp_path / "host.lock"))
    campaign = bench_campaign(tmp_path, tiny_model, trials=2)
    victim = start_worker(campaign, "bench", pg_url, log=tmp_path / "victim.log")
    deadline = time.monotonic() + 300
    bench = None
    while bench is None and time.monotonic() < deadline and victim.poll() is None:
        kids = psutil.Process(victim.pid).children(recursive=True)
        bench = next((k for k in kids if k.name() == "llama-bench"), None)
        time.sleep(0.05)
    assert bench is not None, (tmp_path / "victim.log").read_text()
    victim.send_signal(signal.SIGKILL)  # mid-measurement: llama-bench is running
    victim.wait()
    with contextlib.suppress(psutil.NoSuchProcess):  # its own process group outlives the worker
        bench.kill()
    study = store.load_study("bench", pg_url)
    [killed] = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    survivor = start_worker(None, "bench", pg_url, log=tmp_path / "survivor.log")
    assert survivor.wait(timeout=300) == 0, (tmp_path / "survivor.log").read_text()

    trials = {t.number: t for t in Store(study).records()}
    dead = trials[killed.number]
    assert dead.state == TrialState.FAIL and dead.stale
    [retry] = [t for t in trials.values() if t.retry_of == killed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert retry.host.pid == survivor.pid
    assert sum(t.is_finished for t in trials.values()) == 2  # the dead trial does not use up the budget
    assert all(t.host_lock_wait_s >= 0 for t in trials.values() if t.is_finished)


def test_a_stalled_worker_drops_the_trial_another_worker_reclaimed(tmp_path, pg_url, llama_tools, tiny_model,
                                                                   monkeypatch):
    """A worker whose heartbeat stops for longer than the grace period (a stall, not a death) has its trial failed
    and re-queued by another; when it wakes it must drop its own result instead of crashing or counting it twice."""
    monkeypatch.setenv("AUTOINFER_HOST_LOCK", str(tmp_path / "host.lock"))
    campaign = bench_campaign(tmp_path, tiny_model, trials=1)  # the survivor waits in ask(), where it reclaims
    stalled = start_worker(campaign, "bench", pg_url, log=tmp_path / "stalled.log", quiet=False)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and stalled.poll() is None:
        if any(k.name() == "llama-bench" for k in psutil.Process(stalled.pid).children(recursive=True)):
            break
        time.sleep(0.05)
    stalled.send_signal(signal.SIGSTOP)  # mid-measurement; its llama-bench runs on in its own process group
    study = store.load_study("bench", pg_url)
    survivor = start_worker(None, "bench", pg_url, log=tmp_path / "survivor.log")
    try:
        while time.monotonic() < deadline and not study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            time.sleep(0.2)  # until the survivor has failed the stalled worker's trial
    finally:
        stalled.send_signal(signal.SIGCONT)
    assert stalled.wait(timeout=300) == 0, (tmp_path / "stalled.log").read_text()
    assert survivor.wait(timeout=300) == 0, (tmp_path / "survivor.log").read_text()

    [reclaimed] = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    assert reclaimed.user_attrs["stale"] and "vram_peak_mib" not in reclaimed.user_attrs  # nothing written late
    said = " ".join((tmp_path / "stalled.log").read_text().split())  # the console wraps long lines
    assert f"trial {reclaimed.number} was failed by another worker" in said and "measurement is dropped" in said
    assert "worker done: 0 trial(s) measured here" in said
    trials = Store(study).records()
    [retry] = [t for t in trials if t.retry_of == reclaimed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == reclaimed.params
    assert retry.host.pid == survivor.pid
    assert sum(t.is_finished for t in trials) == 1


def test_worker_of_another_hardware_class_is_refused(tmp_path, pg_url, monkeypatch):
    campaign = load_campaign(replay_campaign(tmp_path, trials=3, name="classy"))
    monkeypatch.setenv(hardware.OVERRIDE_ENV, "lab-a")
    sweep(campaign, storage=pg_url, progress=False)
    monkeypatch.setenv(hardware.OVERRIDE_ENV, "lab-b")
    with pytest.raises(UserError, match=r"hardware class .*declared class 'lab-a'.*declared class 'lab-b'.*--study"):
        sweep(campaign, storage=pg_url, trials=6, progress=False)
    study = store.load_study("classy", pg_url)
    assert len(study.trials) == 3  # nothing of lab-b was mixed in
    # the same machine joins a study of its own
    result = sweep(campaign, study_name="classy-b", storage=pg_url, trials=2, progress=False)
    assert result.ran == 2


def test_sqlite_refuses_a_second_worker_clearly(tmp_path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    campaign_file = replay_campaign(tmp_path, trials=2, name="solo")
    with sqlite_single_worker(url, "solo"):  # a first worker is running
        with pytest.raises(UserError, match="SQLite allows one worker per study.*PostgreSQL"):
            sweep(load_campaign(campaign_file), storage=url, progress=False)
    res = subprocess.run([*CLI, "worker", str(campaign_file), "--study", "solo", "--storage", url, "--gpus", "0,1"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "allows one worker per study; use a PostgreSQL storage" in res.stderr
    assert res.stderr.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize("url, needle", [
    ("postgresql://nobody@127.0.0.1:1/none", "cannot open storage 'postgresql"),
    ("mysql://u@h/db", "coordinates workers on PostgreSQL"),
])
def test_unusable_storage_is_one_line(tmp_path, url, needle):
    res = subprocess.run([*CLI, "worker", str(replay_campaign(tmp_path, trials=1)), "--study", "x", "--storage", url],
                         capture_output=True, text=True)
    assert res.returncode == 2 and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_gpus_option_starts_one_worker_per_gpu(tmp_path, pg_url):
    campaign = replay_campaign(tmp_path, trials=12, name="pergpu")
    parent = subprocess.run([*CLI, "worker", str(campaign), "--study", "pergpu", "--storage", pg_url, "--gpus", "0,1"],
                            capture_output=True, text=True, timeout=300)
    assert parent.returncode == 0, parent.stdout + parent.stderr
    trials = Store(store.load_study("pergpu", pg_url)).records()
    hosts = [t.host for t in trials]
    assert sum(t.is_finished for t in trials) == 12
    assert {h.cuda_visible_devices for h in hosts} <= {"0", "1"}
    pids = {h.pid: h.cuda_visible_devices for h in hosts}  # each child sees one GPU, always the same
    assert len(set(pids.values())) == len(pids)
    assert sum(int(n) for n in re.findall(r"worker done: (\d+) trial", parent.stdout)) == 12
    assert "recommended for study 'pergpu'" in parent.stdout  # once all workers stopped, what the campaign found
    assert "Warning" not in parent.stderr, parent.stderr  # optuna's notes on heartbeats are not the user's business


def test_wall_time_is_the_campaigns_not_each_workers():
    """Two workers' overlapping trials count once, the gap between resumed sessions not at all, and the asking
    worker's own session (anchors, set-up) counts whole."""
    t0 = datetime(2026, 1, 1, 22, 0, 0)
    study = optuna.create_study()

    def add(start_s: float, end_s: float | None) -> None:
        state = TrialState.COMPLETE if end_s is not None else TrialState.RUNNING
        study.add_trial(FrozenTrial(
            number=0, state=state, value=1.0 if end_s is not None else None, values=None,
            datetime_start=t0 + timedelta(seconds=start_s),
            datetime_complete=t0 + timedelta(seconds=end_s) if end_s is not None else None,
            params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, user_attrs={}, system_attrs={},
            intermediate_values={}, trial_id=0))

    add(0, 10)  # worker A
    add(5, 12)  # worker B, overlapping A
    add(100, 104)  # a later session, after a reboot
    assert store.elapsed_s(study) == pytest.approx(16.0)
    now = datetime.now()
    assert store.elapsed_s(study, since=now - timedelta(seconds=30)) == pytest.approx(46.0, abs=0.5)
    add((now - t0).total_seconds() - 20, None)  # running now, inside this worker's session: counted once
    assert store.elapsed_s(study, since=now - timedelta(seconds=30)) == pytest.approx(46.0, abs=0.5)


def test_the_shared_budget_has_room_only_while_its_counted_trials_leave_one(tmp_path):
    """A worker queues an exploration only with room (sweep/runner.py): queued into a full budget, it was left
    waiting when every worker stopped; a trial already queued takes a place."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'room.db'}", study_name="room")
    gate = worker.SharedBudget(study, 2, hardware.bind(study))
    dists = {"x": IntDistribution(0, 9)}
    assert gate.room()
    gate.ask(dists)
    assert gate.room()  # one running of two
    Store(study).enqueue({"x": 3}, explore_after_repeats=3)
    assert not gate.room()  # a queued trial takes the last place: two workers each queued one into it, one was left
    gate.ask(dists)
    assert not gate.room()  # two running fill it, wherever they run
    gate.__exit__()
