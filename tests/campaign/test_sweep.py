"""`autoinfer sweep` end to end with the real llama-bench on tiny synthetic models: store, resume, failures, export."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autoinfer.campaign.plan import host_threads
from autoinfer.campaign.spec import load_campaign, stored_campaign
from autoinfer.engines.llama_common import HUGE_PAGES
from autoinfer.measure.host import huge_pages_refusal, usable_physical_cores
from autoinfer.model.synth import QWEN35_VOCAB

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]

CAMPAIGN = """\
name: {name}
engine: llama-bench
model: {models}
space:
  n_gpu_layers: 0
  threads: 1
  ubatch: [32, 64]
  batch: [64, 128]
  type_v: {type_v}
  flash_attn: {flash_attn}
budget: {{trials: {trials}}}
measure: {{n_prompt: 128, n_gen: {n_gen}, repetitions: 2, timeout_s: 120, max_cv: null}}
search: {{informed: false}}
confirm: {{enabled: false}}
drift: {{every: null}}
idle: {{policy: "off"}}
sampler: {{name: random, seed: 1}}
"""


def campaign(tmp_path: Path, models: list[Path], *, name: str = "e2e", trials: int = 4, n_gen: int = 4,
             type_v: str = "[f16]", flash_attn: str = '["on"]') -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(CAMPAIGN.format(name=name, models="[" + ", ".join(f'"{m}"' for m in models) + "]",
                                    trials=trials, n_gen=n_gen, type_v=type_v, flash_attn=flash_attn))
    return path


def cli(*args: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def env(tmp_path, llama_tools) -> dict[str, str]:
    return {**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results"), "AUTOINFER_LLAMA_BIN": str(llama_tools.bin_dir)}


def study_of(tmp_path: Path, name: str = "e2e") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'results' / 'autoinfer.db'}")


def trial_states(db: Path) -> list[tuple[str, int]]:
    """(state, number of chosen params) per trial, read through a read-only connection, so watching never writes
    to (or creates) the store."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return list(conn.execute(
                "SELECT state, (SELECT COUNT(*) FROM trial_params p WHERE p.trial_id = t.trial_id) "
                "FROM trials t ORDER BY number"))
    except sqlite3.OperationalError:  # tables not created yet, or the database is locked for a moment
        return []


def test_sweep_stores_samples_and_exports_a_pasteable_command(tmp_path, tiny_model, env):
    spaced = tmp_path / "my models" / "it's tiny.gguf"
    spaced.parent.mkdir()
    shutil.copy(tiny_model, spaced)
    done = cli("sweep", str(campaign(tmp_path, [spaced])), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llama-server" in done.stdout and "tok/s" in done.stdout
    trials = [t for t in study_of(tmp_path).trials if "repeat_of" not in t.user_attrs]  # 4 configurations in all
    assert len(trials) == 4 and all(t.user_attrs["outcome"] == "ok" for t in trials)
    assert len({repr(sorted(t.params.items())) for t in trials}) == 4  # each measured once
    for t in trials:
        assert len(t.user_attrs["tg_samples"]) == 2 and len(t.user_attrs["pp_samples"]) == 2
        assert t.user_attrs["rss_peak_mib"] > 0 and t.user_attrs["engine_cmd"][0].endswith("llama-bench")
        folder = tmp_path / "results" / "e2e" / "trials" / str(t.number)
        assert '"samples_ts"' in (folder / "raw_output.txt").read_text()
        assert shlex.split((folder / "command.txt").read_text()) == t.user_attrs["engine_cmd"]
    # the server computed a prompt as long as the measurement's, so its peak holds batches of that size
    assert "deployment check passed: llama-server answered /completion to a 128-token prompt" in " ".join(
        done.stdout.split())
    status = cli("status", "--study", "e2e", cwd=tmp_path, env={**env, "COLUMNS": "300"})
    assert status.returncode == 0 and "4 done of 4" in status.stdout
    said = " ".join(status.stdout.replace("│", " ").split())
    assert "deployment check passed: llama-server answered /completion" in said
    assert "confirmed off (confirm.enabled is false in the campaign)" in said
    server = cli("export", "--study", "e2e", "--format", "server", cwd=tmp_path, env=env)
    argv = shlex.split(server.stdout)
    assert argv[0].endswith("llama-server") and argv[argv.index("-m") + 1] == str(spaced)
    assert argv[argv.index("-np") + 1] == "1"  # one slot, as measured: llama-server's own default is four
    assert "llama-server's peak RSS" in said  # the printed server's own peak, beside the sweep's
    bench = shlex.split(cli("export", "--study", "e2e", "--format", "bench", cwd=tmp_path, env=env).stdout)
    assert bench[bench.index("-m") + 1] == str(spaced)
    run = subprocess.run([*bench, "-r", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and '"avg_ts"' in run.stdout  # the exported bench line runs as it is


def test_huge_pages_run_measured_printed_and_deployed_with_their_environment(tmp_path, tiny_model, env):
    """huge_pages: 1 (engines.llama_common.HUGE_PAGES) is an environment as well as a flag: every trial's child gets
    it, the printed commands start with it and run as printed; a host without huge pages refuses it up front."""
    path = campaign(tmp_path, [tiny_model], trials=2)
    path.write_text(path.read_text().replace("threads: 1", "threads: 1\n  load_mode: none\n  huge_pages: 1"))
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    refusal = huge_pages_refusal()
    if refusal:
        assert done.returncode == 2 and f"space.huge_pages: 1 cannot run here: {refusal}" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(tmp_path).trials
    assert trials and all(t.user_attrs["env"]["knob_environment"] == HUGE_PAGES for t in trials)
    assert all(t.user_attrs["engine_cmd"][t.user_attrs["engine_cmd"].index("--no-host") + 1] == "1" for t in trials)
    assert all(t.user_attrs["metrics"]["huge_pages_mib"] is not None for t in trials)
    assert "MiB of it on huge pages" in done.stdout  # the recommendation says whether it got them
    assert "deployment check passed: llama-server answered /completion" in " ".join(done.stdout.split())
    server = shlex.split(cli("export", "--study", "e2e", "--format", "server", cwd=tmp_path, env=env).stdout)
    assert server[:2] == ["env", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"] and server[2].endswith("llama-server")
    assert "--no-host" in server
    bench = shlex.split(cli("export", "--study", "e2e", "--format", "bench", cwd=tmp_path, env=env).stdout)
    assert bench[:2] == server[:2]
    run = subprocess.run([*bench, "-r", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and '"avg_ts"' in run.stdout


def test_threads_host_searches_this_machines_core_counts(tmp_path, tiny_model, env):
    """`threads: host` runs as shares of the cores this process may use (campaign.plan.host_threads): the decision is
    printed and kept in the study's notes, the study stores the values, and every trial ran one of them."""
    path = campaign(tmp_path, [tiny_model], trials=3)
    path.write_text(path.read_text().replace("threads: 1", "threads: host"))
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    expected, note = host_threads(load_campaign(path), cores=usable_physical_cores())
    assert f"decision: {note}" in " ".join(done.stderr.split())
    study = study_of(tmp_path)
    values = expected.space["threads"]
    assert stored_campaign(study).space["threads"] == values
    allowed = values if isinstance(values, list) else [values]
    assert all(t.user_attrs["config"]["threads"] in allowed for t in study.trials)
    commands = [t.user_attrs["engine_cmd"] for t in study.trials if "engine_cmd" in t.user_attrs]
    assert commands and all(int(argv[argv.index("-t") + 1]) in allowed for argv in commands)
    status = cli("status", "--study", "e2e", cwd=tmp_path, env={**env, "COLUMNS": "400"})
    assert note in " ".join(status.stdout.replace("│", " ").split())


def test_batches_above_the_prompt_are_one_configuration_measured_once(tmp_path, tiny_model, env):
    """llama.cpp runs a batch above llama-bench's prompt as the prompt's, and a ubatch above the batch as the batch
    (Engine.as_run): the sweep says so once, measures that one configuration once, answers its other names from the
    measurement and exports what ran."""
    path = campaign(tmp_path, [tiny_model], trials=2)
    path.write_text(path.read_text().replace("n_prompt: 128", "n_prompt: 32"))
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    note = ("batch 64, 128 as 32; ubatch 64 as 32: llama.cpp caps a batch at the context, here 32 tokens (the "
            "longest the llama-bench engine creates for this campaign's measure)")
    assert f"decision: {note}" in " ".join(done.stderr.split())
    trials = study_of(tmp_path).trials
    measured = [t for t in trials if "repeat_of" not in t.user_attrs]
    assert len(measured) == 1 and measured[0].user_attrs["outcome"] == "ok"
    assert len({repr(sorted(t.params.items())) for t in trials}) == 4  # every name of it was asked
    assert all(t.user_attrs["repeat_of"] == measured[0].number for t in trials if t not in measured)
    assert all((t.user_attrs["config"]["batch"], t.user_attrs["config"]["ubatch"]) == (32, 32) for t in trials)
    bench = shlex.split(cli("export", "--study", "e2e", "--format", "bench", cwd=tmp_path, env=env).stdout)
    assert (bench[bench.index("-b") + 1], bench[bench.index("-ub") + 1]) == ("32", "32")
    status = cli("status", "--study", "e2e", cwd=tmp_path, env={**env, "COLUMNS": "400"})
    said = " ".join(status.stdout.replace("│", " ").split())
    assert note in said and f"recommended trial {measured[0].number}: " in said
    assert "ubatch=32 batch=32" in said.split("recommended trial")[1]  # as it ran, whatever name was asked


def test_failed_trials_are_recorded_and_the_sweep_goes_on(tmp_path, tiny_model, env):
    corrupt = tmp_path / "corrupt.gguf"
    shutil.copy(QWEN35_VOCAB, corrupt)  # a well-formed GGUF with no tensors: llama.cpp cannot load it
    path = campaign(tmp_path, [tiny_model, corrupt], trials=6, type_v="[f16, q8_0]", flash_attn='["on", "off"]')
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(tmp_path).trials
    by_outcome: dict[str, list] = {}
    for t in trials:
        by_outcome.setdefault(t.user_attrs["outcome"], []).append(t)
    assert by_outcome.get("ok") and by_outcome.get("load_failed"), by_outcome.keys()
    for t in by_outcome["load_failed"]:
        assert t.params["model"] == str(corrupt) and t.user_attrs["reason"]
    for t in by_outcome.get("rejected", []):  # known refusals are recorded without starting llama.cpp
        assert t.user_attrs["unmeasured"] and "flash attention" in t.user_attrs["reason"]
        assert t.params["type_v"] == "q8_0" and t.params["flash_attn"] == "off" and not t.user_attrs["engine_cmd"]
        assert t.state.name == "PRUNED" and t.constraints == {"rejected": 1.0}  # infeasible to the sampler
    measured = [t for t in trials if not t.user_attrs.get("unmeasured")]
    assert len(measured) == 6  # refusals cost no measurement and do not count against the budget


def test_resume_after_sigkill_keeps_finished_trials_and_reruns_the_interrupted_one(tmp_path, tiny_model, env):
    path = campaign(tmp_path, [tiny_model], trials=4, n_gen=2048)  # seconds per trial: time to catch one running
    proc = subprocess.Popen([*CLI, "sweep", str(path), "--quiet"], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = tmp_path / "results" / "autoinfer.db"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:  # one trial finished, the next running its params
            time.sleep(0.2)
            states = trial_states(db)
            chosen = max((n for state, n in states if state == "COMPLETE"), default=0)
            # every parameter chosen, as many as a finished trial has: killed between two suggestions, the trial
            # would hold only some, and its retry rightly samples the rest
            if chosen and states[-1][0] == "RUNNING" and states[-1][1] >= chosen:
                break
        else:
            pytest.fail("the sweep never had a finished and a running trial")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a sweep that already ended has no group left to kill
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {t.number: (t.params, t.value) for t in study_of(tmp_path).trials
              if t.state == optuna.trial.TrialState.COMPLETE}
    interrupted = study_of(tmp_path).trials[-1]
    assert interrupted.state == optuna.trial.TrialState.RUNNING

    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(tmp_path).trials
    for number, (params, value) in before.items():  # nothing finished was lost or measured again
        assert (trials[number].params, trials[number].value) == (params, value)
    stale = trials[interrupted.number]
    assert stale.state == optuna.trial.TrialState.FAIL and stale.user_attrs["stale"]
    retry = [t for t in trials if t.system_attrs.get("fixed_params") == interrupted.params
             or t.user_attrs.get("retry_of") == interrupted.number]
    assert retry and retry[0].state == optuna.trial.TrialState.COMPLETE and retry[0].params == interrupted.params
    finished = [t for t in trials if t.state.is_finished() and not t.user_attrs.get("stale")
                and "repeat_of" not in t.user_attrs]  # a configuration suggested again is answered, not run
    assert len(finished) == 4  # the budget counts what was done before the crash


def test_a_trial_killed_before_its_configuration_was_chosen_is_failed_and_not_requeued(tmp_path):
    from autoinfer.coordination.worker import reclaim_stale

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'db.sqlite'}", study_name="s")
    study.ask()  # RUNNING with no params: the process died between ask() and its first suggest
    chosen = study.ask()
    chosen.suggest_categorical("batch", [64, 128])
    assert reclaim_stale(study) == 1
    trials = study.get_trials()
    assert [t.state.name for t in trials[:2]] == ["FAIL", "FAIL"] and all(t.user_attrs["stale"] for t in trials[:2])
    assert "nothing to re-run" in trials[0].user_attrs["reason"]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [(t.params, t.user_attrs["retry_of"]) for t in waiting] == [({}, 1)]  # enqueued: fixed in system attrs
    assert waiting[0].system_attrs["fixed_params"] == chosen.params


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda text, tmp: text.replace("model: [", 'model: ["/nowhere/missing.gguf", '), "does not exist"),
        (lambda text, tmp: text.replace("model: [", f'model: ["{tmp / "notes.txt"}", '), "not a GGUF file"),
        (lambda text, tmp: text.replace("  threads: 1", "  threadz: 1"), "has no parameter 'threadz'"),
        (lambda text, tmp: text.replace("ubatch: [32, 64]", "ubatch: []"), "empty list"),
        (lambda text, tmp: text.replace("budget: {trials: 2}", "budget: {trials: 2}\nconstraints: {vram_mib: 0}"),
         "constraints.vram_mib"),
        (lambda text, tmp: text.replace("engine: llama-bench", "engine: llama-turbo"), "unknown engine"),
        (lambda text, tmp: text.replace("model: [", f'model: ["{tmp / "half.gguf"}", '),
         "half.gguf is damaged: tensor"),
    ],
)
def test_bad_input_exits_2_and_leaves_the_study_untouched(tmp_path, tiny_model, env, mutate, needle):
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "half.gguf").write_bytes(tiny_model.read_bytes()[: tiny_model.stat().st_size // 2])
    good = campaign(tmp_path, [tiny_model], trials=2)
    assert cli("sweep", str(good), "--quiet", cwd=tmp_path, env=env).returncode == 0
    db = tmp_path / "results" / "autoinfer.db"
    stored = [(t.number, t.state, t.params) for t in study_of(tmp_path).trials]
    bad = tmp_path / "bad.yaml"
    bad.write_text(mutate(good.read_text(), tmp_path))
    mtime = db.stat().st_mtime_ns
    done = cli("sweep", str(bad), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert db.stat().st_mtime_ns == mtime
    assert [(t.number, t.state, t.params) for t in study_of(tmp_path).trials] == stored


def test_a_vram_budget_on_a_machine_without_a_gpu_is_refused(tmp_path, tiny_model, env):
    path = campaign(tmp_path, [tiny_model], trials=2)
    path.write_text(path.read_text().replace("budget: {trials: 2}", "budget: {trials: 2}\nconstraints: {vram_mib: 8192}"))
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "constraints.vram_mib is 8192 MiB but this machine has no NVIDIA GPU" in lines[0]
    assert "remove constraints.vram_mib" in lines[0] and not (tmp_path / "results" / "autoinfer.db").exists()


def test_a_study_whose_trials_all_failed_is_described_truthfully(tmp_path, env):
    broken = tmp_path / "no-tensors.gguf"
    shutil.copy(QWEN35_VOCAB, broken)  # well-formed, loads in no trial
    path = campaign(tmp_path, [broken], trials=3, type_v="[f16, q8_0]")
    path.write_text(path.read_text().replace("confirm: {enabled: false}", "confirm: {enabled: true}"))
    done = cli("sweep", str(path), "--quiet", cwd=tmp_path, env=env)
    assert done.returncode == 3 and "no recommendation" in done.stderr, done.stderr[-2000:]
    assert "deployment check" not in done.stdout  # nothing to start: the diagnosis ends the sweep
    measured = [t for t in study_of(tmp_path).trials if t.user_attrs["outcome"] != "repeat"]  # repeats never ran
    assert len(measured) == 3 and all(t.user_attrs["outcome"] == "load_failed" for t in measured)
    status = cli("status", "--study", "e2e", cwd=tmp_path, env={**env, "COLUMNS": "300"})
    said = " ".join(status.stdout.replace("│", " ").split())
    assert "not yet (runs when the trial budget is spent)" not in said
    assert "skipped at the end of the sweep: 0 successful configuration(s)" in said
    report = cli("analyze", "--study", "e2e", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr[-2000:]
    text = " ".join((tmp_path / "results" / "e2e" / "report" / "report.md").read_text().split())
    assert "not on this machine" not in text and "only 0 searched parameter" not in text
    assert re.search(r"no successful trial: 3 of \d+ ended load_failed; e\.g\. \S", text), text[:2000]
    searched = {k for t in study_of(tmp_path).trials for k in t.distributions}
    assert len(searched) >= 3 and f"no successful trial, so the {len(searched)} searched parameters" in text
