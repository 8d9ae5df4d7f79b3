"""The typed records read what earlier versions stored (the same attribute names and layouts), store what they read,
and the Store reads and writes them on a real study."""

from __future__ import annotations

from dataclasses import fields, replace

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from autoinfer.engines.base import Decision
from autoinfer.store.records import (
    Alternative,
    AnchorRun,
    Confirmation,
    ConfirmRun,
    DeploymentCheck,
    DriftEvent,
    DriftState,
    Finalist,
    FinalistComparison,
    HardwareClass,
    ImportJunk,
    MemoryCalibration,
    Noise,
    StudyRecord,
    TrialHost,
    TrialRecord,
    Verdict,
    attrs_of,
)
from autoinfer.store.trials import Store, record_of, write_trial

#: A trial's user attributes as earlier versions wrote them (one of every kind).
STORED_TRIAL = {
    "host": {"hostname": "box", "pid": 41, "hardware_class": "a1b2", "cuda_visible_devices": "0"},
    "config": {"model": "m.gguf", "threads": 4, "override_tensors": []},
    "imposed_settings": {"repack": 0},
    "idle": {"busy": False, "waited_s": 0.5},
    "outcome": "ok", "reason": "measured twice", "engine_cmd": ["/b/llama-bench", "-m", "m.gguf"],
    "tg_samples": [10.0, 11.0, 12.0], "pp_samples": [100.0, 101.0, 99.0],
    "vram_peak_mib": 7000.0, "vram_per_gpu_mib": [7000.0, 3000.0], "rss_peak_mib": 900.5, "context_mib": 656.2,
    "wall_s": 3.5, "engine_s": 2.0, "metrics": {"replay_row": 3}, "stand_in": True,
    "env": {"started_at": 1.0, "gpu_name": "H100"},
    "noise": {"first_cv": 0.3, "max_cv": 0.15, "rerun": True, "first_tg_samples": [5.0, 12.0, 11.0],
              "first_pp_samples": [100.0, 100.0, 100.0], "rerun_outcome": "ok"},
    "stats": {"tg": {"n": 3, "median": 11.0, "ci": [10.0, 12.0], "cv": 0.09}},
    "host_lock_wait_s": 0.25, "predicted_mib": 6900.0, "predicted_std_mib": 120.0,
    "search_reason": "local: threads 2 → 4 from trial 0", "label": "informed: neighbour",
    "fit_override_tensors": [r"blk\.(3)\.ffn_.*_exps\.weight=CPU"], "fit_tensor_split": "17/24",
    "remeasure_of": 1, "retry_of": 2, "again_of": 0, "repeat_of": 3, "explore_after_repeats": 3,
    "unmeasured": True, "stale": True, "kld": 0.01, "ppl": 8.5, "kld_reference": "ref.gguf",
    "source_file": "seed.tsv", "source_line": 7,
}

#: A study's user attributes as earlier versions wrote them.
STORED_STUDY = {
    "campaign": '{"name": "c"}',
    "confirmed": {
        "time": 1.5, "alpha": 0.05, "test": "mannwhitney", "rounds": 5, "memory_tolerance": 0.02,
        "speed_tolerance": 0.02, "precision": 0.03, "objective": {"tg": 1.0}, "after_trials": 12,
        "finalists": [{"trial": 3, "params": {"threads": 4}, "scores": [10.0, 11.0], "median": 10.5,
                       "ci": [10.0, 11.0], "memory_mib": 7000.0, "memory_kind": "vram", "failed_runs": 0,
                       "context_mib": 656.2}],
        "runs": [{"round": 0, "trial": 3, "outcome": "ok", "reason": "", "score": 10.0, "tg_samples": [10.0],
                  "pp_samples": [], "vram_peak_mib": 7000.0, "rss_peak_mib": None, "idle_busy": False}],
        "leader": 3, "recommended": 3, "tie": True, "tied_with": [5],
        "comparisons": [{"trial": 5, "p_value": 0.2, "differ": False, "test": "mannwhitney", "ratio": 1.05,
                         "ratio_ci": [0.98, 1.1], "differ_holm": False}],
        "alternative": {"trial": 5, "speed": 10.0, "memory_mib": 6000.0, "slower": 0.01, "saves_mib": 1000.0,
                        "context_mib": 348.0},
        "why": "confirmed: fastest median"},
    "drift": {"config": {"model": "m.gguf"}, "anchors": [
        {"index": 0, "label": "start", "after_trial": 0, "time": 2.0, "outcome": "ok", "reason": "", "score": 10.0,
         "ratio": None, "drifted": False, "tg_samples": [10.0], "pp_samples": [], "idle_busy": False, "trial": 0,
         "discarded": True},
        {"index": 1, "label": "periodic", "after_trial": 4, "time": 3.0, "outcome": "ok", "reason": "",
         "score": 13.0, "ratio": 1.3, "drifted": True, "tg_samples": [13.0], "pp_samples": [], "idle_busy": False,
         "trial": None, "rebased": True}],
        "from_trial": 0, "events": [{"time": 4.0, "after_trial": 4, "flagged": [1, 2], "requeued": [1]}]},
    "drift_flagged": [1, 2],
    "imposed_settings": [{"knob": "repack", "value": 0, "reason": "its smoke run crashed"}],
    "hardware_class": {"digest": "a1b2", "fields": {"gpus": ["H100 80 GiB"]}},
    "deployment_check": {"status": "passed", "reason": "", "trial": 3, "command": "llama-server -m m.gguf",
                         "answer": "the", "tokens": 8, "wall_s": 2.5},
    "imported_files": ["seed.tsv"],
    "import_junk": [{"file": "seed.tsv", "line": 9, "reason": "no tok/s value"}],
    "memory_model": {"m.gguf": {"trials": 6, "loo_median_rel_error": 0.04, "noise_mib": 50.0, "side": "device"}},
    "search_notes": ["no GPU: no llama-fit-params baseline"],
    "pareto_front": [3, 5],
    "contest": {"contest": '{"name": "duel"}', "entries": [
        {"key": 0, "study": "llama", "engine": "llama-bench", "trial": 3, "baseline": False},
        {"key": 1, "study": "ours", "engine": "reference", "trial": 5, "baseline": False}],
        "left_out": ["third: no feasible successful trial"], "after_trials": {"llama": 12, "ours": 8},
        "final": None},
    "stopped": "trial budget of 12 reached",
}


def _stored_trial(attrs: dict) -> optuna.trial.FrozenTrial:
    return create_trial(value=11.0, params={"threads": 4}, distributions={"threads": IntDistribution(1, 8)},
                        user_attrs=attrs)


def test_a_trial_stored_by_an_earlier_version_reads_into_every_field():
    r = record_of(_stored_trial(STORED_TRIAL))
    assert {f.name for f in fields(TrialRecord) if f.metadata.get("attr")} == set(STORED_TRIAL)
    assert r.host == TrialHost("box", 41, "a1b2", "0")
    assert r.noise == Noise(0.3, 0.15, True, (5.0, 12.0, 11.0), (100.0, 100.0, 100.0), "ok")
    assert r.engine_cmd == ("/b/llama-bench", "-m", "m.gguf") and r.tg_samples == (10.0, 11.0, 12.0)
    assert (r.remeasure_of, r.retry_of, r.again_of, r.repeat_of) == (1, 2, 0, 3) and r.unmeasured and r.stale
    assert r.origin == {"remeasure_of": 1, "retry_of": 2, "again_of": 0, "repeat_of": 3}
    assert r.value == 11.0 and r.params == {"threads": 4} and r.trial_config.threads == 4
    assert r.kld_samples == [0.01] and r.samples("pp") == [100.0, 101.0, 99.0]
    assert (r.budget_peak("device"), r.budget_peak("host")) == (7000.0 + 656.2, 900.5 + 656.2)  # the serving context's
    assert r.to_attrs() == STORED_TRIAL  # and it stores them back unchanged


def test_a_trial_with_nothing_recorded_reads_as_the_defaults():
    r = record_of(_stored_trial({"outcome": "crash", "engine_s": None, "metrics": None}))
    assert r.outcome == "crash" and r.reason == "" and r.engine_cmd == () and r.metrics == {} and r.host is None
    assert not r.stale and r.origin == {} and r.kld_samples == [] and r.to_attrs() == {"outcome": "crash"}
    assert record_of(_stored_trial({"later_version_attr": 1})).to_attrs() == {}  # unknown: left out
    with pytest.raises(TypeError):  # the empty default every such record shares cannot be changed through one
        r.env["gpu_name"] = "H100"


def test_what_the_loop_asks_of_a_trial():
    ok = TrialRecord(0, TrialState.COMPLETE, values=(5.0,), outcome="ok")
    assert ok.is_finished and ok.is_feasible_ok and ok.status == "ok"
    assert not replace(ok, constraints={"vram_mib": 10.0}).is_feasible_ok
    assert not replace(ok, unmeasured=True).is_finished and not replace(ok, stale=True).is_finished
    assert replace(ok, remeasure_of=0).is_remeasurement
    assert TrialRecord(1, TrialState.RUNNING).status == "running"
    assert TrialRecord(1, TrialState.WAITING).status == "waiting"
    assert TrialRecord(1, TrialState.FAIL).status == "fail"
    assert TrialRecord(1, TrialState.COMPLETE, values=(1.0, 2.0, 3.0)).value is None  # a Pareto study's trial
    with pytest.raises(ValueError, match="trial 1 has no configuration"):
        TrialRecord(1, TrialState.FAIL).trial_config


def test_a_misspelt_field_is_refused_before_anything_is_stored():
    with pytest.raises(TypeError, match="no stored field 'outcomes'"):
        attrs_of(outcomes="ok")


def test_a_study_stored_by_an_earlier_version_reads_into_every_field():
    r = StudyRecord.from_attrs(STORED_STUDY)
    assert {f.name for f in fields(StudyRecord)} == set(STORED_STUDY)
    c = r.confirmed
    assert c.finalists == (Finalist(3, {"threads": 4}, (10.0, 11.0), 10.5, (10.0, 11.0), 7000.0, "vram", 0, 656.2),)
    assert c.runs == (ConfirmRun(0, 3, "ok", "", 10.0, (10.0,), (), 7000.0, None, False),)
    assert c.verdict == Verdict(3, 3, True, (5,), (FinalistComparison(5, 0.2, False, "mannwhitney", 1.05, (0.98, 1.1),
                                                                      False),),
                                Alternative(5, 10.0, 6000.0, 0.01, 1000.0, 348.0), "confirmed: fastest median")
    assert c.finalist(3).median == 10.5 and c.after_trials == 12
    assert r.drift.anchors[0] == AnchorRun(0, "start", 0, 10.0, None, False, 2.0, "ok", "", (10.0,), (), False, 0,
                                           discarded=True)
    assert r.drift.anchors[1].rebased and r.drift.events == (DriftEvent(4.0, 4, (1, 2), (1,)),)
    assert r.drift_flagged == {1, 2} and r.imposed_settings == (Decision("repack", 0, "its smoke run crashed"),)
    assert r.hardware_class == HardwareClass("a1b2", {"gpus": ["H100 80 GiB"]})
    assert r.deployment_check == DeploymentCheck("passed", "", 3, "llama-server -m m.gguf", "the", 8, 2.5)
    assert r.import_junk == (ImportJunk("seed.tsv", 9, "no tok/s value"),)
    assert r.memory_model == {"m.gguf": MemoryCalibration(6, 0.04, 50.0, "device")}
    assert r.pareto_front == (3, 5) and r.search_notes == ("no GPU: no llama-fit-params baseline",)
    assert r.contest.label(1) == "ours trial 5 (reference)" and r.contest.after_trials == {"llama": 12, "ours": 8}
    assert r.contest.winner is None and r.contest.left_out == ("third: no feasible successful trial",)
    assert r.stopped == "trial budget of 12 reached"
    assert r.to_attrs() == STORED_STUDY  # and it stores them back unchanged


def test_records_of_an_older_layout_fill_what_it_lacks():
    """Anchor runs without an index (their position), a confirmation without the settings of later versions."""
    drift = DriftState.from_attr({"config": None, "anchors": [
        {"label": "start", "score": 1.0, "drifted": False, "ratio": None, "after_trial": 0}]})
    assert drift.anchors[0].index == 0 and drift.from_trial is None and drift.events == ()
    old = Confirmation.from_attr({"recommended": 0, "finalists": [{"trial": 0, "median": 1.0, "scores": [1.0]}]})
    assert old.verdict.recommended == 0 and old.finalist(0).ci is None and old.precision is None


def test_the_store_reads_and_writes_records_on_a_study():
    study = optuna.create_study(directions=["maximize"])
    study_store = Store(study)
    study_store.enqueue({"x": 1}, label="informed: neighbour", fit_tensor_split="1/2")
    trial = study.ask({"x": IntDistribution(0, 2)})
    asked = record_of(trial)
    assert asked.state == TrialState.RUNNING and asked.label == "informed: neighbour" and asked.params == {"x": 1}
    write_trial(trial, host=TrialHost("box", 1), tg_samples=(1.0, 2.0), outcome="ok")
    assert trial.user_attrs["host"] == {"hostname": "box", "pid": 1, "hardware_class": "",
                                        "cuda_visible_devices": None} and trial.user_attrs["tg_samples"] == [1.0, 2.0]
    study.tell(trial, 1.5)
    [stored] = study_store.records()
    assert stored.values == (1.5,) and stored.host.hostname == "box" and stored == study_store.record(0)
    study_store.write_study(drift_flagged=frozenset({2, 0}), pareto_front=())
    assert study.user_attrs == {"drift_flagged": [0, 2], "pareto_front": []}
    assert study_store.study_record().drift_flagged == {0, 2}
    study_store.add_trials([replace(stored, label="imported", source_file="f.csv", source_line=3)])
    imported = study_store.record(1)
    assert (imported.label, imported.source_line, imported.values, imported.host) == ("imported", 3, (1.5,),
                                                                                      stored.host)
