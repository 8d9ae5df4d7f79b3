"""Multi-objective mode: three directions, the front stored and shown, export picks from it within a budget."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoinfer.campaign.spec import parse_campaign
from autoinfer.cli import app
from autoinfer.errors import UserError
from autoinfer.search import pareto
from autoinfer.sweep.replay_cli import OFFLINE
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
