"""A serving context (campaign key serve.context): the budget holds every trial to its measured peak plus the KV
cache of the context llama-bench did not create, the search's boundary moves by it, and the printed server runs it."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.replay import parameter_columns, read_table
from autoinfer.errors import UserError
from autoinfer.export.formats import render
from autoinfer.model.shape import ModelShape
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.recommend import as_best, recommend, runs_of
from autoinfer.sweep.replay_cli import OFFLINE, _space
from autoinfer.sweep.report import print_status
from autoinfer.sweep.runner import sweep

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables"
TABLE = TABLES / "h100-35b-knobs.csv"  # flash attention on (its .meta.json; auto counts as on), f16 V cache
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}


def _campaign(table: Path, budget: float, trials: int, context: int | None):
    df = read_table(table)
    data = {
        "name": "serve", "engine": "replay", "engine_options": {"table": str(table), "seed": 0},
        "model": str(table), "space": _space(df, parameter_columns(df)), "objective": "tg",
        "budget": {"trials": trials}, "constraints": {"vram_mib": budget}, "sampler": {"name": "tpe", "seed": 0},
        "search": {"informed": True, "skip_predicted": True, "strategy": "boundary", "fit_params": False}, **OFFLINE,
    }
    if context is not None:
        data["serve"] = {"context": context}
    return parse_campaign(data, str(table))


@pytest.fixture
def table(tmp_path) -> Path:
    """A copy of the table and its shape."""
    out = tmp_path / TABLE.name
    out.write_text(TABLE.read_text())
    out.with_suffix(".shape.json").write_text(TABLE.with_suffix(".shape.json").read_text())
    return out


def _growth_mib(shape: ModelShape, type_k: str, ubatch: int, tokens: int) -> float:
    """What `tokens` more positions take on the GPU, worked out here from the shape alone: the KV cache of every
    attention layer, and the f16 attention mask flash attention reads (a row per position for each ubatch token)."""
    per_token = shape.n_head_kv * (shape.key_length * KV_BYTES[type_k] + shape.value_length * KV_BYTES["f16"])
    return tokens * (per_token * len(shape.attention_layers) + 2 * ubatch) / 2 ** 20


def test_each_peak_is_held_to_the_budget_with_the_serving_contexts_kv_cache(table):
    budget, context = 8192.0, 65536
    shape = ModelShape.from_json(table.with_suffix(".shape.json").read_text())
    campaign = _campaign(table, budget, 8, context)
    study = sweep(campaign, storage=MEMORY_STORAGE, progress=False).study
    measured = 256 * math.ceil((campaign.measure.n_prompt + campaign.measure.n_gen) / 256)
    trials = [t for t in Store(study).records() if not t.unmeasured]
    assert trials
    for t in trials:
        growth = _growth_mib(shape, t.params["type_k"], t.params["ubatch"], context - measured)
        assert t.context_mib == pytest.approx(growth, abs=0.1)
        if t.outcome == "ok":
            assert t.vram_peak_mib + t.context_mib <= budget
        else:
            assert t.outcome == "infeasible"
            assert "serving context" in t.reason and t.vram_peak_mib + t.context_mib > budget
    # the table's largest share that fits 8 GiB with the measured context does not fit with 64k more positions
    df = pd.read_csv(TABLE)
    plain = df[df.vram_mib <= budget].cpu_expert_layers.min()
    grown = df[df.vram_mib + [_growth_mib(shape, k, u, context - measured) for k, u in zip(df.type_k, df.ubatch)]
               <= budget]
    assert grown.cpu_expert_layers.min() > plain
    assert trials[0].params["cpu_expert_layers"] == grown.cpu_expert_layers.min()

    best = as_best(study, recommend(study))
    assert best is not None and best.trial.vram_peak_mib + best.trial.context_mib <= budget
    # memory breaks a tie, and a lighter alternative is offered, by the peak as the budget counts it
    ok = [t for t in trials if t.outcome == "ok" and t.is_feasible_ok]
    assert {r.trial: (r.memory_mib, r.context_mib) for r in runs_of(ok, {"tg": 1.0}, set(), side="device")} == {
        t.number: (t.vram_peak_mib, t.context_mib) for t in ok}
    argv = shlex.split(render("server", best, study.study_name, campaign.engine))
    assert argv[argv.index("-c") + 1] == str(context)
    console = Console(record=True, width=200)
    print_status(console, study)
    counted = [t.context_mib for t in trials]
    row = next(line for line in console.export_text().splitlines() if "serving context" in line)
    assert f"{context} tokens, the printed server's -c; {min(counted):.0f}-{max(counted):.0f} MiB" in row


def test_without_a_serving_context_nothing_is_added_and_the_server_gets_the_measured_context(table):
    campaign = _campaign(table, 8192.0, 2, None)
    study = sweep(campaign, storage=MEMORY_STORAGE, progress=False).study
    assert all(t.context_mib is None for t in Store(study).records())
    best = as_best(study, recommend(study))
    argv = shlex.split(render("server", best, study.study_name, campaign.engine))
    assert int(argv[argv.index("-c") + 1]) < 1024


def test_a_table_without_its_shape_cannot_count_the_context(table):
    table.with_suffix(".shape.json").unlink()
    with pytest.raises(UserError, match=r"serve\.context 32768: .*\.shape\.json or drop serve\.context"):
        sweep(_campaign(table, 8192.0, 2, 32768), storage=MEMORY_STORAGE, progress=False)


def test_the_context_given_twice_is_refused():
    with pytest.raises(UserError, match="given twice"):
        parse_campaign({"name": "x", "engine": "llama-server", "model": "m.gguf", "space": {"ctx_size": 4096},
                        "serve": {"context": 8192}})
