"""Final re-measurement: interleaved fresh runs of the top configurations, a test of whether the leaders differ,
ties resolved toward the cheaper configuration; `status` and `export` show the confirmed result."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from autoinfer.campaign.spec import parse_campaign
from autoinfer.cli import app
from autoinfer.errors import UserError
from autoinfer.paths import default_storage, results_dir
from autoinfer.search.fit_baseline import FIT_LABEL
from autoinfer.store import trials as store
from autoinfer.store.records import ConfirmRun
from autoinfer.sweep import runner
from autoinfer.sweep.confirm import decide, finalist_label, finalists, judge, precise_enough, ratio_line, summary
from autoinfer.sweep.recommend import recommend

# ------------------------------------------------------------------------------------------------ campaign keys


def _campaign(**keys):
    return parse_campaign({"name": "c", "model": "m.gguf", **keys})


def test_confirm_defaults():
    c = _campaign()
    assert (c.confirm.enabled, c.confirm.top_k, c.confirm.rounds, c.confirm.alpha, c.confirm.test) == (
        True, 3, 5, 0.05, "paired")


@pytest.mark.parametrize("key,value", [("top_k", 1), ("rounds", 1), ("alpha", 0.0), ("test", "ks"),
                                       ("rounds", "many"), ("extra", 1)])
def test_bad_confirm_value_names_the_key(key, value):
    with pytest.raises(UserError, match=rf"confirm\.{key}"):
        _campaign(confirm={key: value})


# ------------------------------------------------------------------------------------------------ the decision


def test_clear_winner_is_not_a_tie():
    scores = {0: [100.0, 101.0, 99.0, 100.5, 100.2], 1: [80.0, 81.0, 79.0, 80.5, 80.2]}
    verdict = decide(scores, {0: 5000.0, 1: 3000.0}, alpha=0.05, test="mannwhitney")
    assert verdict.leader == 0 and verdict.recommended == 0 and not verdict.tie
    assert verdict.comparisons[0].differ_holm is True


def test_indistinguishable_leaders_within_the_speed_tolerance_are_a_tie_and_the_cheaper_one_is_recommended():
    scores = {0: [100.0, 97.0, 103.0, 99.0, 101.5], 1: [99.0, 102.0, 98.0, 100.0, 101.0],
              2: [60.0, 61.0, 59.0, 60.5, 60.2]}
    verdict = decide(scores, {0: 9000.0, 1: 4000.0, 2: 1000.0}, alpha=0.05, test="mannwhitney",
                     speed_tolerance=0.02)
    assert verdict.tie and set(verdict.tied_with) == {1 if verdict.leader == 0 else 0}
    assert verdict.recommended == 1  # least memory among the tied leaders; 2 is cheaper but slower
    assert {c.trial: c.differ_holm for c in verdict.comparisons}[2] is True
    assert verdict.alternative.trial == 2 and verdict.alternative.saves_mib == 3000.0


def test_memory_does_not_replace_a_faster_leader_that_the_test_cannot_separate():
    """The H100 case: trials 4 (71.8 tok/s, 7586 MiB) and 0 (61.9 tok/s, 7154 MiB) tie by the rank test with a few
    noisy rounds. 0 is 13% slower: the leader is recommended and 0 offered as the lighter alternative."""
    scores = {4: [71.8, 62.8, 74.1, 58.0, 72.9], 0: [61.9, 63.8, 72.1, 55.0, 60.2]}
    verdict = decide(scores, {4: 7586.0, 0: 7154.0}, alpha=0.05, test="mannwhitney", memory_tolerance=0.02,
                     speed_tolerance=0.02)
    assert verdict.tie and verdict.recommended == 4 and "objective decides" in verdict.why
    assert verdict.alternative is None  # 5.7% less memory for 13% less speed is no trade worth offering
    scores[0] = [71.0, 62.5, 73.0, 57.5, 72.0]  # 2% slower: the 432 MiB are offered on their own line
    alt = decide(scores, {4: 7586.0, 0: 7154.0}, alpha=0.05, test="mannwhitney", memory_tolerance=0.02,
                 speed_tolerance=0.01).alternative
    assert alt.trial == 0 and alt.saves_mib == pytest.approx(432.0)
    assert alt.slower == pytest.approx(1 - statistics.median(scores[0]) / statistics.median(scores[4]))


def test_ratio_is_said_as_hyperfine_says_it_and_more_rounds_until_the_ci_is_narrow():
    assert ratio_line(3, 0, 1.1612, (1.12, 1.20)) == "trial 3 ran 1.16 ± 0.04 times faster than trial 0"
    tight = {0: [100.0, 100.5, 99.5, 100.2, 99.8], 1: [80.0, 80.4, 79.6, 80.1, 79.9]}
    loose = {0: [100.0, 130.0, 75.0, 110.0, 90.0], 1: [80.0, 104.0, 60.0, 88.0, 72.0]}
    assert precise_enough(tight, 0.03, "mannwhitney") and not precise_enough(loose, 0.03, "mannwhitney")


def test_a_few_kib_of_memory_do_not_outweigh_a_faster_median():
    """Measured on a 2-core VM: two tied finalists whose RSS peaks differ by 16 KiB. Within the tolerance the
    faster median is recommended; without one the 16 KiB decide."""
    scores = {9: [1950.5, 1974.6, 2035.2, 1862.1, 1906.3], 7: [2286.0, 2110.4, 1207.9, 1241.6, 1267.4]}
    memory = {9: 26.5234375, 7: 26.5078125}
    wide = {"alpha": 0.05, "test": "mannwhitney", "speed_tolerance": 0.5}  # 7's median is within 50% of 9's
    assert decide(scores, memory, memory_tolerance=0.02, **wide).recommended == 9
    assert decide(scores, memory, **wide).recommended == 7


@pytest.mark.parametrize("fast, slow, tail", [
    ([72.0, 73.0, 71.0], [60.0, 61.0, 59.0], "(too few runs to tell apart: 3 against 3 cannot differ at alpha=0.05)"),
    ([72.0, 73.0, 71.0, 72.5, 71.5], [60.0, 61.0, 59.0, 60.5, 59.5], ""),
    ([72.0, 61.0, 71.0, 60.5, 71.5], [60.0, 73.0, 59.0, 72.5, 59.5], "(not different at alpha=0.05)")])
def test_the_ratio_line_says_when_the_runs_were_too_few_to_differ(fast, slow, tail):
    """Three runs a side can never reject at 0.05 (Mann-Whitney's smallest p is 0.1): a clear ratio with a narrow
    CI beside "not different" read as a measured tie (a sweep on an H100: "1.18 ± 0.08 times faster ... (not
    different at alpha=0.05)")."""
    runs = [ConfirmRun(r, n, "ok", "", x, (x,), (), 1000.0, 1000.0, False)
            for n, xs in ((0, fast), (1, slow)) for r, x in enumerate(xs)]
    record = judge({0: {}, 1: {}}, runs, len(fast), _campaign(confirm={"test": "mannwhitney"}).confirm, {"tg": 1.0},
                   None)
    line = summary(record).splitlines()[-1]
    assert line.startswith("  trial 0 ran") and line.endswith("times faster than trial 1" + (" " + tail if tail else ""))


def test_prompt_speed_is_said_beside_a_decode_objective_and_only_there():
    """A decode objective leaves the prompt out of the verdict; the lines say what the leader trades for it."""
    runs = [ConfirmRun(r, n, "ok", "", x, (x,), (pp,), 1000.0, 1000.0, False)
            for n, x, pp in ((0, 80.0, 300.0), (1, 70.0, 600.0)) for r in range(5)]
    spec = _campaign(confirm={"test": "mannwhitney"}).confirm
    decode = summary(judge({0: {}, 1: {}}, runs, 5, spec, {"tg": 1.0}, None)).splitlines()
    assert decode[-1] == "    prompt processing (not in the objective): 300 against 600 tok/s, 0.50x"
    assert decode[-2].startswith("  trial 0 ran 1.14")
    assert "prompt processing" not in summary(judge({0: {}, 1: {}}, runs, 5, spec, {"tg": 1.0, "pp": 0.1}, None))


def test_the_default_paired_test_compares_round_by_round_and_a_drift_cancels():
    """Both finalists drift up 30% over five rounds and 0 runs 5% faster in each: as two samples the drift hides it
    (Mann-Whitney), round by round it is told apart, the ratio the rounds' geometric mean. A round where one of them
    failed is left out of their pairs; a pair with fewer than 2 rounds in common is compared as two samples, and the
    comparison names the test it used."""
    slow = [100.0, 108.0, 115.0, 122.0, 130.0]
    fast = [x * 1.05 * j for x, j in zip(slow, (1.0, 0.99, 1.01, 1.0, 0.995))]
    runs = [ConfirmRun(r, n, "ok", "", x, (x,), (), 1000.0, 1000.0, False)
            for n, xs in ((0, fast), (1, slow)) for r, x in enumerate(xs)]
    spec = _campaign().confirm
    paired = judge({0: {}, 1: {}}, runs, 5, spec, {"tg": 1.0}, None).verdict.comparisons[0]
    assert (paired.test, paired.differ_holm) == ("paired-t", True)
    assert paired.ratio == pytest.approx(1.05, abs=0.005) and paired.ratio_ci[0] > 1
    two = judge({0: {}, 1: {}}, runs, 5, _campaign(confirm={"test": "mannwhitney"}).confirm, {"tg": 1.0}, None)
    assert not two.verdict.comparisons[0].differ_holm
    failed = [dataclasses.replace(x, outcome="oom", score=None) if (x.trial, x.round) == (1, 2) else x for x in runs]
    left_out = judge({0: {}, 1: {}}, failed, 5, spec, {"tg": 1.0}, None).verdict.comparisons[0]
    assert left_out.ratio == pytest.approx(1.05, abs=0.005) and left_out.test == "paired-t"
    apart = [x for x in runs if (x.trial == 0 and x.round < 2) or (x.trial == 1 and x.round >= 2)]
    assert judge({0: {}, 1: {}}, apart, 5, spec, {"tg": 1.0}, None).verdict.comparisons[0].test == "mannwhitney"
    assert precise_enough({0: fast, 1: slow}, 0.03, "paired", {0: list(range(5)), 1: list(range(5))})
    assert not precise_enough({0: fast, 1: slow}, 0.03, "mannwhitney")


def test_memory_breaks_a_tie_on_the_budgets_side_with_the_serving_contexts_share():
    """Two finalists the rounds cannot tell apart. At llama-bench's short context 0 peaks 200 MiB lower, but its f16
    KV cache grows 656 MiB at a 32768-token serving context against 1's 348 (q8_0): as served, 1 is the lighter one,
    and the lighter alternative says how much of its memory the context is. A host budget compares RSS, not VRAM."""
    speeds = {0: [100.0, 97.0, 103.0, 99.0, 101.5], 1: [99.0, 102.0, 98.0, 100.0, 101.0]}
    vram, rss = {0: 7600.0, 1: 7800.0}, {0: 3000.0, 1: 2000.0}
    runs = [ConfirmRun(r, n, "ok", "", x, (x,), (), vram[n], rss[n], False)
            for n, xs in speeds.items() for r, x in enumerate(xs)]
    spec = _campaign(confirm={"speed_tolerance": 0.05, "memory_tolerance": 0.005}).confirm

    def verdict(side, context=None):
        return judge({0: {}, 1: {}}, runs, 5, spec, {"tg": 1.0}, None, side=side, context=context).verdict

    assert verdict("device").recommended == 0
    served = judge({0: {}, 1: {}}, runs, 5, spec, {"tg": 1.0}, None, side="device", context={0: 656.0, 1: 348.0})
    assert served.verdict.recommended == 1 and served.finalist(1).context_mib == 348.0
    assert (served.finalist(1).memory_mib, served.finalist(1).memory_kind) == (7800.0, "vram")
    assert verdict("host").recommended == 1 and verdict(None).recommended == 0  # without a budget: the device peak
    slower = [dataclasses.replace(x, score=x.score * 0.97) if x.trial == 1 else x for x in runs]
    alt = judge({0: {}, 1: {}}, slower, 5, _campaign(confirm={"speed_tolerance": 0.01}).confirm, {"tg": 1.0}, None,
                side="host", context={0: 656.0, 1: 348.0}).verdict.alternative
    assert (alt.trial, alt.memory_mib, alt.saves_mib, alt.context_mib) == (1, 2348.0, 1308.0, 348.0)
    assert alt.line().endswith("(97.00 at 2348 MiB, 348 of them for the serving context)")


def test_with_the_paired_test_a_finalist_that_failed_in_the_fast_rounds_is_not_judged_by_its_lower_median():
    """The machine speeds up round by round; finalist 1 runs 5% faster than 0 in every round both ran, then fails in
    the last two. Its median comes from the slow rounds only and is lower than 0's: Mann-Whitney's leader is 0, the
    paired test's is 1, ahead in the rounds both ran."""
    zero = [100.0, 110.0, 120.0, 130.0, 140.0]
    one = [x * 1.05 * j for x, j in zip(zero[:3], (1.0, 0.99, 1.01))]
    scores, memory = {0: zero, 1: one}, {0: 1000.0, 1: 1000.0}
    assert decide(scores, memory, alpha=0.05, test="mannwhitney").leader == 0
    paired = decide(scores, memory, alpha=0.05, test="paired", score_rounds={0: list(range(5)), 1: [0, 1, 2]})
    assert paired.leader == paired.recommended == 1 and "round by round" in paired.why
    assert paired.comparisons[0].trial == 0 and paired.comparisons[0].ratio == pytest.approx(1.05, abs=0.005)


def test_finalist_without_two_successful_runs_is_not_judged():
    verdict = decide({0: [10.0, 11.0, 12.0, 10.5], 1: [50.0]}, {0: 1.0, 1: 1.0}, alpha=0.05, test="welch")
    assert verdict.leader == 0 and verdict.comparisons == ()
    assert decide({0: []}, {0: 1.0}, alpha=0.05, test="welch").recommended is None


def test_finalists_are_distinct_feasible_and_not_drift_flagged(tmp_path):
    study = optuna.create_study(direction="maximize")
    dist = {"threads": CategoricalDistribution([1, 2, 3, 4])}

    def add(threads: int, tg: float, outcome: str = "ok") -> None:
        study.add_trial(create_trial(
            params={"threads": threads}, distributions=dist, value=tg, state=TrialState.COMPLETE,
            user_attrs={"outcome": outcome, "tg_samples": [tg], "config": {"model": "m", "threads": threads}}))

    add(1, 50.0)
    add(2, 90.0)
    add(2, 95.0)  # same configuration as the one before: one finalist
    add(3, 99.0)  # flagged by the drift anchor below
    add(4, 200.0, outcome="crash")
    study.set_user_attr("drift_flagged", [3])  # as a study stores it
    chosen = finalists(study, {"tg": 1.0}, top_k=3)
    assert [t.number for t in chosen] == [2, 0]


def test_llama_fit_params_answer_is_confirmed_beside_the_leaders():
    """The answer to beat is measured in the same interleaved rounds, whatever its rank, and named as such."""
    study = optuna.create_study(direction="maximize")
    dist = {"threads": CategoricalDistribution([1, 2, 3, 4, 5])}
    for threads, tg in ((1, 40.0), (2, 90.0), (3, 95.0), (4, 80.0), (5, 70.0)):
        label = {"label": f"{FIT_LABEL} for 8192 MiB"} if threads == 1 else {}
        study.add_trial(create_trial(
            params={"threads": threads}, distributions=dist, value=tg, state=TrialState.COMPLETE,
            user_attrs={"outcome": "ok", "tg_samples": [tg], "config": {"model": "m", "threads": threads}, **label}))
    chosen = finalists(study, {"tg": 1.0}, top_k=3)
    assert [t.number for t in chosen] == [2, 1, 3, 0]
    label = finalist_label({t.number: t for t in chosen})
    assert label(0) == "trial 0 (llama-fit-params' answer)" and label(2) == "trial 2"
    assert [t.number for t in finalists(study, {"tg": 1.0}, top_k=5)] == [2, 1, 3, 4, 0]  # among them: once


def test_the_leaders_host_buffer_twins_are_confirmed_beside_it():
    """How the weights kept in RAM are held (mmap, pinned, huge pages) moves generation by about one process's
    scatter: the leader's measured twins in it are re-measured beside it whatever their rank, the best-ranked one
    per way of holding them, and only twins: a trial that also differs in another knob is not one."""
    study = optuna.create_study(direction="maximize")
    dist = {"threads": CategoricalDistribution([1, 2]), "load_mode": CategoricalDistribution(["mmap", "none"]),
            "huge_pages": CategoricalDistribution([0, 1])}
    for threads, load_mode, huge_pages, tg in ((2, "mmap", 0, 100.0), (1, "mmap", 0, 99.0), (1, "none", 1, 98.0),
                                               (2, "none", 1, 90.0), (2, "none", 1, 92.0), (2, "none", 0, 80.0),
                                               (1, "none", 0, 97.0)):
        params = {"threads": threads, "load_mode": load_mode, "huge_pages": huge_pages}
        study.add_trial(create_trial(
            params=params, distributions=dist, value=tg, state=TrialState.COMPLETE,
            user_attrs={"outcome": "ok", "tg_samples": [tg], "config": {"model": "m", **params}}))
    chosen = finalists(study, {"tg": 1.0}, top_k=2)
    # the top two (trials 0 and 1), then trial 0's twins: on huge pages (trial 4 ranks above trial 3, the same
    # configuration) and pinned (trial 5); trial 2 and 6 differ in threads too
    assert [t.number for t in chosen] == [0, 1, 4, 5]
    label = finalist_label({t.number: t for t in chosen})
    assert label(4) == "trial 4 (trial 0 with load_mode none, huge_pages 1)"
    assert label(5) == "trial 5 (trial 0 with load_mode none, huge_pages 0)"
    assert label(1) == "trial 1"
    assert [t.number for t in finalists(study, {"tg": 1.0}, top_k=3)] == [0, 1, 2, 4, 5]


# ------------------------------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def small_model() -> Path:
    from autoinfer.model.synth import cached_model

    return cached_model("small", "Q8_0")


def _two_model_campaign(llama_tools, tiny: Path, small: Path, **extra):
    return parse_campaign({
        "name": "confirm-e2e",
        "engine_options": {"llama_bin": str(llama_tools.bin_dir)},
        "model": [str(tiny), str(small)],
        "space": {"n_gpu_layers": 0, "threads": 2},
        "budget": {"trials": 2},
        "measure": {"n_prompt": 0, "n_gen": 8, "repetitions": 3, "timeout_s": 300, "max_cv": None},
        "drift": {"every": None},
        "idle": {"policy": "off"},
        **extra,
    })


@pytest.mark.slow
def test_interleaved_confirmation_in_fresh_processes_and_status_export(llama_tools, tiny_model, small_model):
    """tiny (9 MB) vs small (128 MB) synthetic models: the small one is several times slower per token, so the
    confirmed leader must be the tiny one; the runs alternate and each is its own llama-bench process."""
    campaign = _two_model_campaign(llama_tools, tiny_model, small_model,
                                   confirm={"top_k": 2, "rounds": 4, "max_rounds": 4})
    study = runner.open_study(campaign, campaign.name, default_storage())
    for model in (str(tiny_model), str(small_model)):  # both configurations are measured once
        study.enqueue_trial({"model": model})
    result = runner.sweep(campaign, progress=False)
    by_model = {t.params["model"]: t.number for t in result.study.trials}
    assert set(by_model) == {str(tiny_model), str(small_model)}

    record = result.study.user_attrs["confirmed"]  # as stored
    runs = record["runs"]
    assert len(runs) == 8 and all(r["outcome"] == "ok" for r in runs)
    for r in range(4):  # every round runs each finalist once, the order rotating: A B, B A, A B, B A
        order = [x["trial"] for x in runs if x["round"] == r]
        assert sorted(order) == sorted(by_model.values())
    assert [x["trial"] for x in runs[:2]] == [x["trial"] for x in runs[2:4]][::-1]
    folders = sorted((results_dir() / "confirm-e2e" / "confirm").iterdir())
    assert len(folders) == 8
    assert all("llama-bench" in (f / "command.txt").read_text() for f in folders)
    assert record["leader"] == by_model[str(tiny_model)]
    assert all(len(f["scores"]) == 4 for f in record["finalists"])

    rec = recommend(result.study)
    assert rec is not None and rec.confirmed and rec.trial == record["recommended"]
    assert rec.speed == next(f["median"] for f in record["finalists"] if f["trial"] == record["recommended"])

    cli = CliRunner()
    status = cli.invoke(app, ["status", "--study", "confirm-e2e"], terminal_width=200)
    assert status.exit_code == 0, status.output
    assert "confirmed" in status.output and f"trial {record['recommended']}" in status.output
    exported = cli.invoke(app, ["export", "--study", "confirm-e2e", "--format", "json"])
    assert exported.exit_code == 0, exported.output
    data = json.loads(exported.output)
    assert data["trial"] == record["recommended"] and data["confirmed"]["runs"] == runs


@pytest.mark.slow
def test_too_few_rounds_is_a_tie_and_the_objective_still_decides(llama_tools, tiny_model, small_model):
    """Three runs per side can never differ at alpha=0.05 by Mann-Whitney (the two-sample test a campaign may choose
    instead of the paired default): whatever the speeds, that is a tie. The small model is several times slower, far
    outside the speed tolerance, so memory does not decide: the faster median is recommended and the ratio is
    printed as hyperfine does."""
    campaign = _two_model_campaign(llama_tools, tiny_model, small_model,
                                   confirm={"enabled": False, "top_k": 2, "rounds": 3, "max_rounds": 3,
                                            "test": "mannwhitney"})
    study = runner.open_study(campaign, campaign.name, default_storage())
    for model in (str(tiny_model), str(small_model)):
        study.enqueue_trial({"model": model})
    first = runner.sweep(campaign, progress=False)
    assert "confirmed" not in first.study.user_attrs  # confirm.enabled false: nothing at the end

    cli = CliRunner()  # `autoinfer sweep --confirm` on the finished study: no new trial, only the confirmation
    result = cli.invoke(app, ["sweep", str(_write(campaign)), "--confirm", "--quiet"], terminal_width=200)
    assert result.exit_code == 0, result.output
    study = store.load_study("confirm-e2e", None)
    record = study.user_attrs["confirmed"]
    assert len(study.trials) == 2 and len(record["runs"]) == 6
    assert all(r["outcome"] == "ok" for r in record["runs"]), [r["reason"] for r in record["runs"]]
    assert record["tie"] and all(c["p_value"] >= 0.1 for c in record["comparisons"])
    memory = {f["trial"]: f["memory_mib"] for f in record["finalists"]}
    assert all(m is not None and m > 0 for m in memory.values())
    assert record["recommended"] == record["leader"]
    flat = " ".join(result.output.split())  # the console wraps long lines
    assert "times faster than trial" in flat and "3 against 3 cannot differ at alpha=0.05" in flat
    tg = [statistics.median(r["tg_samples"]) for r in record["runs"] if r["trial"] == record["recommended"]]
    headline = f"generation tok/s: {statistics.median(tg):.2f} over 3 confirmation runs"  # before the search's run
    assert headline in result.output, result.output
    status = cli.invoke(app, ["status", "--study", "confirm-e2e"], terminal_width=200)
    flat = " ".join(status.output.split())
    assert "times faster than" in flat and f"{statistics.median(tg):.2f} over 3 confirmation" in status.output


def _write(campaign) -> Path:
    import yaml

    data = json.loads(campaign.model_dump_json(exclude={"source"}))
    path = results_dir() / "campaign.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path
