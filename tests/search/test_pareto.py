"""Multi-objective mode: three directions, the front stored and shown, export picks from it within a budget."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from autoinfer.campaign.spec import parse_campaign
from autoinfer.cli import app
from autoinfer.engines.replay import parameter_columns, read_table
from autoinfer.errors import UserError
from autoinfer.search import pareto
from autoinfer.store.records import Confirmation, ConfirmRun, Verdict
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.recommend import recommend
from autoinfer.sweep.replay_cli import OFFLINE, _space
from autoinfer.sweep.report import print_status
from autoinfer.sweep.runner import sweep

from .planted import planted_table


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    table = planted_table(tmp_path_factory.mktemp("planted"))
    campaign = parse_campaign({
        "name": "front", "engine": "replay", "engine_options": {"table": str(table)}, "model": str(table),
        "space": {"n_gpu_layers": [36, 41], "placement": ["first", "even"],
                  "cpu_expert_layers": {"low": 0, "high": 40, "step": 4}, "ubatch": [256, 1024]},
        "objective": "pareto", "budget": {"trials": 25}, "search": {"fit_params": False, "prune_below": None},
        **OFFLINE})
    storage = f"sqlite:///{tmp_path_factory.mktemp('db') / 'a.db'}"
    return sweep(campaign, storage=storage, progress=False).study, storage


def test_front_is_stored_and_non_dominated(study):
    study, _ = study
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MAXIMIZE", "MINIMIZE"]
    front = pareto.front(study)
    everyone = pareto.points(study)
    assert len(front) >= 2 and study.user_attrs["pareto_front"] == [p.trial.number for p in front]  # as stored
    for p in front:
        assert not any(q.dominates(p) for q in everyone)
    optuna_front = {t.number for t in study.best_trials if "repeat_of" not in t.user_attrs}  # repeats: told the same
    assert optuna_front == {p.trial.number for p in front}  # Optuna agrees


def test_pick_respects_budget_and_objective(study):
    study, _ = study
    front = pareto.front(study)
    budget = front[len(front) // 2].mem_mib
    best = pareto.pick(study, budget, "tg")
    assert best.value == max(p.tg for p in front if p.mem_mib <= budget)
    assert pareto.pick(study, budget, "pp").value == max(p.pp for p in front if p.mem_mib <= budget)
    with pytest.raises(UserError, match="fits in 1 MiB"):
        pareto.pick(study, 1, "tg")
    with pytest.raises(UserError, match="--objective"):
        pareto.pick(study, budget, "speed")


def test_status_and_export_show_the_front(study):
    study, storage = study
    runner = CliRunner()
    status = runner.invoke(app, ["status", "--study", "front", "--storage", storage])
    assert status.exit_code == 0, status.output
    assert "pareto trial" in status.output and "sampled" in status.output
    budget = pareto.front(study)[0].mem_mib
    out = runner.invoke(app, ["export", "--study", "front", "--storage", storage, "--format", "json",
                              "--vram-budget", str(budget + 1), "--objective", "tg"])
    assert out.exit_code == 0, out.output
    assert f'"trial": {pareto.pick(study, budget + 1, "tg").trial.number}' in out.output


def _knob_study(tmp_path, objective, pp_none: float):
    """mmap runs generation fastest; without it (pinned host experts) generation is 3% slower, the prompt pp_none."""
    rows = []
    for mode, tg, pp in (("mmap", 100.0, 300.0), ("none", 97.0, pp_none)):
        for threads, scale in ((16, 1.0), (8, 0.9)):
            rows.append({"load_mode": mode, "threads": threads, "tg": tg * scale, "pp": pp, "vram_mib": 12000.0,
                         "tg_samples": " ".join([f"{tg * scale:.1f}"] * 3), "pp_samples": " ".join([f"{pp:.0f}"] * 3)})
    table = tmp_path / "modes.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    df = read_table(table)
    campaign = parse_campaign({
        "name": "modes", "engine": "replay", "engine_options": {"table": str(table)}, "model": str(table),
        "space": _space(df, parameter_columns(df)), "objective": objective, "budget": {"trials": 4},
        "search": {"fit_params": False}, **OFFLINE}, str(table))
    return sweep(campaign, storage=MEMORY_STORAGE, progress=False).study


def test_a_tg_objective_names_the_configuration_that_runs_the_prompt_far_faster(tmp_path):
    study = _knob_study(tmp_path, "tg", 2400.0)
    rec = recommend(study)
    assert study.trials[rec.trial].params == {"load_mode": "mmap", "threads": 16}
    alt = pareto.prompt_alternative(study, rec.trial)
    assert alt is not None and study.trials[alt.trial].params == {"load_mode": "none", "threads": 16}
    assert alt.line().startswith(f"prompt-faster alternative: trial {alt.trial}, tg 97.0 against 100.0 (3% slower), "
                                 "pp 2400 against 300 (8.0x)")
    console = Console(width=250, record=True, file=io.StringIO())
    print_status(console, study)
    assert alt.line()[:60] in console.export_text()
    assert pareto.prompt_alternative(_knob_study(tmp_path, "tg", 400.0), rec.trial) is None  # 1.3x: not worth a line
    balanced = _knob_study(tmp_path, {"tg": 1, "pp": 1}, 2400.0)  # the objective weighs the prompt itself
    assert pareto.prompt_alternative(balanced, recommend(balanced).trial) is None


def test_a_prompt_alternative_faster_by_the_searchs_medians_says_faster_and_a_flagged_one_is_left_out(tmp_path):
    """The recommendation is the confirmation's; the alternative's line compares the search's medians, which can put
    it above the recommendation (a configuration the confirmation did not take among its finalists): the line says
    "faster", not "-4% slower". A drift-flagged trial is no alternative, as it is no finalist."""
    study = _knob_study(tmp_path, "tg", 2400.0)
    rec = recommend(study)
    line = pareto.PromptAlternative(3, 96.4, 1637.0, 92.5, 607.0).line()
    assert "tg 96.4 against 92.5 (4% faster), pp 1637 against 607 (2.7x)" in line
    alt = pareto.prompt_alternative(study, rec.trial)
    study.set_user_attr("drift_flagged", [alt.trial])  # as a study stores it
    assert pareto.prompt_alternative(study, rec.trial) is None


def _confirmed(study, measured: dict[int, tuple[float, float]]) -> None:
    """Store a confirmation that ran each trial in 3 rounds at (tg, pp), scattered by +-1%."""
    runs = tuple(ConfirmRun(r, n, "ok", "", tg * f, (tg * f,), (pp * f,), None, 30.0, False)
                 for r, f in enumerate((0.99, 1.0, 1.01)) for n, (tg, pp) in measured.items())
    Store(study).write_study(confirmed=Confirmation(None, 0.05, "mannwhitney", 3, 0.02, 0.02, 0.03, {"tg": 1.0}, 4,
                                                    (), runs, Verdict()))


def test_a_prompt_alternative_the_confirmation_measured_is_judged_by_its_runs(tmp_path):
    """In the first run of the default campaign the line called a configuration 2% faster than the recommendation
    by the search's medians, which the confirmation had measured 1.03 +- 0.04 times slower: where the confirmation
    measured both, its runs decide whether there is an alternative and what the line says."""
    study = _knob_study(tmp_path, "tg", 2400.0)
    numbers = {tuple(t.params.values()): t.number for t in study.trials}
    rec, alt = numbers[("mmap", 16)], numbers[("none", 16)]
    _confirmed(study, {rec: (100.0, 300.0), alt: (98.0, 2000.0)})
    line = pareto.prompt_alternative(study, rec).line()
    assert (f"trial {alt}, tg 98.0 against 100.0 (2% slower), pp 2000 against 300 (6.7x), the medians of the "
            "confirmation's interleaved runs") in line
    _confirmed(study, {rec: (100.0, 300.0), alt: (90.0, 2000.0)})  # 10% slower by the confirmation: no alternative
    assert pareto.prompt_alternative(study, rec) is None
    _confirmed(study, {rec: (100.0, 300.0)})  # the alternative was no finalist: the search's medians, as before
    assert "tg 97.0 against 100.0 (3% slower), pp 2400 against 300 (8.0x), the medians of the search's runs" in (
        pareto.prompt_alternative(study, rec).line())
