"""A contest: llama.cpp's campaign and the reference engine's under one budget, each swept as its own study, then a
final that re-measures their best configurations interleaved and recommends one (`autoinfer sweep CONTEST.yaml`)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from autoinfer.campaign.contest import load_contest
from autoinfer.campaign.spec import parse_campaign
from autoinfer.errors import UserError
from autoinfer.search.fit_baseline import FIT_LABEL
from autoinfer.store.records import ConfirmRun, ContestEntry, ContestRecord
from autoinfer.store.trials import Store
from autoinfer.sweep.confirm import judge
from autoinfer.sweep.contest import contender_finalists
from autoinfer.sweep.report import print_contest

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]

LLAMA = """\
name: {name}
engine: llama-bench
model: "{model}"
space:
  n_gpu_layers: 0
  threads: 1
  ubatch: [32, 64]
  batch: [64, 128]
budget: {{trials: 2}}
measure: {{n_prompt: 64, n_gen: {n_gen}, repetitions: 2, timeout_s: 120, max_cv: null}}
search: {{informed: false}}
confirm: {{enabled: false}}
drift: {{every: null}}
idle: {{policy: "off"}}
sampler: {{name: random, seed: 1}}
"""

REFERENCE = """\
name: ours
engine: reference
model: "{model}"
space:
  moe: [loop, grouped]
  torch_threads: 1
budget: {{trials: 2}}
measure: {{n_prompt: 64, n_gen: 4, repetitions: 2, timeout_s: 120, max_cv: null}}
search: {{informed: false, fit_params: false}}
confirm: {{enabled: false}}
drift: {{every: null}}
idle: {{policy: "off"}}
sampler: {{name: random, seed: 1}}
"""

CONTEST = """\
name: duel
contenders: [llama.yaml, ours.yaml]
confirm: {rounds: 2, max_rounds: 2}
"""


def files(tmp_path: Path, model: Path, *, n_gen: int = 4, contest: str = CONTEST) -> Path:
    (tmp_path / "llama.yaml").write_text(LLAMA.format(name="llama", model=model, n_gen=n_gen))
    (tmp_path / "ours.yaml").write_text(REFERENCE.format(model=model))
    path = tmp_path / "duel.yaml"
    path.write_text(contest)
    return path


def test_contenders_that_measure_different_things_are_refused_with_the_key(tmp_path):
    path = files(tmp_path, tmp_path / "m.gguf", n_gen=8)
    with pytest.raises(UserError, match=r"differ in measure\.n_gen \(8 vs 4\)"):
        load_contest(path)


def test_contenders_must_serve_the_same_context_and_each_engine_sets_its_own_context_knob(tmp_path):
    path = files(tmp_path, tmp_path / "m.gguf")
    llama = tmp_path / "llama.yaml"
    llama.write_text(llama.read_text() + "serve: {context: 4096}\n")
    with pytest.raises(UserError, match=r"differ in serve\.context \(4096 vs None\)"):
        load_contest(path)
    ours = tmp_path / "ours.yaml"
    ours.write_text(ours.read_text() + "serve: {context: 4096}\n")
    llama_campaign, ours_campaign = load_contest(path)[1]
    assert llama_campaign.fixed()["ctx_size"] == 4096  # llama-bench: exported, its KV cache counted in a budget
    assert ours_campaign.fixed()["max_context"] == 4096 and "ctx_size" not in ours_campaign.fixed()


@pytest.mark.parametrize("contest,needle", [
    ("name: duel\ncontenders: [llama.yaml]\n", "contenders"),
    ("name: duel\ncontenders: [llama.yaml, llama.yaml]\n", "listed twice"),
    ("name: duel\ncontenders: [llama.yaml, ours.yaml]\nconfirm: {top_k: 3}\n", "set `finalists:`"),
    ("name: llama\ncontenders: [llama.yaml, ours.yaml]\n", "distinct names"),
    ("name: duel\ncontenders: [llama.yaml, duel.yaml]\n", "is itself a contest"),
])
def test_a_bad_contest_is_refused_in_one_line(tmp_path, contest, needle):
    with pytest.raises(UserError, match=needle):
        load_contest(files(tmp_path, tmp_path / "m.gguf", contest=contest))


def test_a_bad_contest_exits_2_from_the_cli_before_any_study(tmp_path):
    path = files(tmp_path, tmp_path / "m.gguf", n_gen=8)
    env = {**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results")}
    done = subprocess.run([*CLI, "sweep", str(path)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 2 and "measure.n_gen" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "results" / "autoinfer.db").exists()


@pytest.mark.slow
def test_a_contest_ranks_llama_cpp_and_the_reference_engine_in_one_interleaved_final(tmp_path, tiny_model,
                                                                                    llama_tools):
    env = {**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results"), "COLUMNS": "250",
           "AUTOINFER_LLAMA_BIN": str(llama_tools.bin_dir)}
    path = files(tmp_path, tiny_model)
    done = subprocess.run([*CLI, "sweep", str(path), "--quiet"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'results' / 'autoinfer.db'}"
    for name, engine in (("llama", "llama-bench"), ("ours", "autoinfer.refengine.worker")):
        trials = [t for t in optuna.load_study(study_name=name, storage=storage).trials
                  if t.user_attrs.get("outcome") == "ok"]
        assert len(trials) == 2 and all(engine in " ".join(t.user_attrs["engine_cmd"]) for t in trials)
    record = Store(optuna.load_study(study_name="duel", storage=storage)).study_record().contest
    assert [(e.study, e.engine) for e in record.entries] == [("llama", "llama-bench"), ("ours", "reference")]
    final = record.final
    assert final.rounds == 2 and [r.trial for r in final.runs] == [0, 1, 1, 0]  # interleaved, rotated per round
    assert all(r.outcome == "ok" and r.score > 0 for r in final.runs)
    assert all(len(f.scores) == 2 for f in final.finalists)
    winner, loser = record.entry(final.verdict.leader), record.entry(final.verdict.comparisons[0].trial)
    said = " ".join(done.stdout.split())
    assert f"{winner.label()} ran" in said and f"faster than {loser.label()}" in said
    assert f"recommended by contest 'duel': {record.winner.label()}" in said
    exported = subprocess.run([*CLI, "export", "--format", "bench"], capture_output=True, text=True, cwd=tmp_path,
                              env=env)
    assert exported.returncode == 0, exported.stderr
    argv = shlex.split(exported.stdout)
    if record.winner.engine == "reference":
        assert argv[1:3] == ["-m", "autoinfer.refengine.worker"] and "skipped" in said
    else:
        assert argv[0].endswith("llama-bench") and "deployment check passed" in said
    run = subprocess.run([*argv, *(["-r", "1"] if argv[0].endswith("llama-bench") else [])], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]  # the exported winner runs as it is
    status = subprocess.run([*CLI, "status", "--study", "duel"], capture_output=True, text=True, cwd=tmp_path,
                            env=env)
    assert status.returncode == 0 and "final over 2 interleaved rounds" in status.stdout
    again = subprocess.run([*CLI, "sweep", str(path), "--quiet"], capture_output=True, text=True, cwd=tmp_path,
                           env=env, timeout=600)
    assert again.returncode == 0 and "the stored final stands" in again.stdout
    assert Store(optuna.load_study(study_name="duel", storage=storage)).study_record().contest == record


def test_llama_fit_params_answer_joins_the_final_beside_the_contenders_recommendation():
    """A contender that measured llama-fit-params' answer within the budget brings it to the final as the baseline,
    whatever its rank, so the final says how much faster than llama.cpp's own fit the winner ran; an answer over the
    budget is no baseline."""
    campaign = parse_campaign({"name": "c", "model": "m.gguf"})
    dist = {"threads": CategoricalDistribution([1, 2, 3, 4])}

    def study_with(fit_outcome: str) -> optuna.Study:
        study = optuna.create_study(direction="maximize")
        for threads, tg in ((1, 60.0), (2, 90.0), (3, 95.0), (4, 80.0)):
            fit = threads == 1
            study.add_trial(create_trial(
                params={"threads": threads}, distributions=dist, value=tg, state=TrialState.COMPLETE,
                user_attrs={"outcome": fit_outcome if fit else "ok", "tg_samples": [tg],
                            "config": {"model": "m", "threads": threads},
                            **({"label": f"{FIT_LABEL} for 8192 MiB"} if fit else {})}))
        return study

    assert [t.number for t in contender_finalists(study_with("ok"), campaign, 1)] == [2, 0]
    assert [t.number for t in contender_finalists(study_with("ok"), campaign, 2)] == [2, 1, 0]
    assert [t.number for t in contender_finalists(study_with("infeasible"), campaign, 1)] == [2]
    entry = ContestEntry(1, "llama", "llama-bench", 0, baseline=True)
    assert entry.label() == "llama trial 0 (llama-bench, llama-fit-params' answer)"
    stored = ContestRecord.from_attr({"contest": "{}", "entries": [{"key": 0, "study": "llama", "engine": "llama-bench",
                                                                    "trial": 3}]})  # before the baseline was
    assert stored.entries == (ContestEntry(0, "llama", "llama-bench", 3, baseline=False),)


def test_the_final_names_the_baseline_and_counts_the_serving_context_as_the_budget_does():
    """The final's table and lines name llama-fit-params' answer, and each finalist's memory says what the serving
    context adds to its measured peak (what the budget counted), as the recommendation's headline does; the host's
    RSS stands beside it (the median of the runs)."""
    entries = (ContestEntry(0, "ours", "reference", 5), ContestEntry(1, "llama", "llama-bench", 1, baseline=True))
    runs = [ConfirmRun(r, key, "ok", "", tg, (tg,), (pp,), 7400.0 + key, rss + r, False)
            for r in range(5) for key, tg, pp, rss in ((0, 110.0 + r, 700.0, 52119.0), (1, 70.0 + r, 350.0, 19017.0))]
    final = judge({0: {}, 1: {}}, runs, 5, parse_campaign({"name": "c", "model": "m.gguf"}).confirm, {"tg": 1.0},
                  None, lambda k: entries[k].label(), side="device", context={0: None, 1: 656.2})
    console = Console(record=True, width=250)
    print_contest(console, "duel", ContestRecord("{}", entries, (), {}, final))
    said = " ".join(console.export_text().split())
    assert "llama trial 1 (llama-fit-params' answer)" in said
    assert "vram 7401 MiB + 656 at the serving context │ 19019 MiB" in said and "vram 7400 MiB │ 52121 MiB" in said
    assert ("ours trial 5 (reference) ran 1.5" in said
            and "times faster than llama trial 1 (llama-bench, llama-fit-params' answer)" in said)
    assert "prompt processing (not in the objective): 700 against 350 tok/s, 2.00x" in said
