"""llama-fit-params' answer as the sweep's baseline: measured first, asked again for less after an overshoot, its
raw overrides kept where the searched placement cannot say the same. llama-fit-params needs a GPU, so a stand-in
answers from a planted table the way the real one missed on an H100 (its answer's peak over the budget)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest
from rich.console import Console

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines import base
from autoinfer.engines.base import Baseline
from autoinfer.engines.replay import ReplayEngine
from autoinfer.model.placement import EXPERT_TENSORS, cpu_expert_layers, expert_override
from autoinfer.search.context import SearchContext
from autoinfer.search.fit_baseline import FIT_LABEL, as_llama_runs_it, fit_params_trial
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.replay_cli import OFFLINE
from autoinfer.sweep.report import print_status
from autoinfer.sweep.runner import sweep

from .planted import N_LAYERS, planted_table

BUDGET = 16384.0


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return planted_table(tmp_path_factory.mktemp("planted"))


def _spec(planted: Path, trials: int = 6) -> dict:
    return {"name": "fit", "engine": "replay", "engine_options": {"table": str(planted)}, "model": str(planted),
            "space": {"n_gpu_layers": 41, "placement": ["first", "last", "even"],
                      "cpu_expert_layers": {"low": 0, "high": N_LAYERS, "step": 2}, "ubatch": [256, 512, 1024]},
            "constraints": {"vram_mib": BUDGET}, "budget": {"trials": trials}, "objective": "tg",
            "search": {"informed": True, "strategy": "boundary", "fit_params": True}, **OFFLINE}


def _last_peaks(planted: Path) -> pd.Series:
    """Peak by count of the `last` placement at ubatch 512 (the baseline's knob values), all layers on the GPU."""
    df = pd.read_csv(planted)
    rows = df[(df.n_gpu_layers == 41) & (df.placement == "last") & (df.ubatch == 512)]
    return rows.set_index("cpu_expert_layers").vram_mib.sort_index()


def test_an_answer_over_the_budget_is_asked_again_for_less(planted, monkeypatch):
    peaks = _last_peaks(planted)
    optimism = float(peaks[peaks > BUDGET].iloc[-1]) - BUDGET  # its estimate misses by the first count over
    asked: list[float] = []

    def stand_in(self, model, budget_mib, n_ctx, batch, ubatch):
        asked.append(budget_mib)
        count = int(peaks[peaks <= budget_mib + optimism].index.min())
        return Baseline(41, expert_override(cpu_expert_layers("last", count, N_LAYERS)), None, "stand-in")

    monkeypatch.setattr(ReplayEngine, "baseline", stand_in)
    study = sweep(parse_campaign(_spec(planted)), storage=MEMORY_STORAGE, progress=False).study
    trials = Store(study).records()
    first, second, third = trials[:3]
    assert first.label == f"{FIT_LABEL} for {BUDGET:.0f} MiB" and first.vram_peak_mib > BUDGET
    assert first.status == "infeasible" and first.params["placement"] == "last"
    assert asked[:2] == [BUDGET, BUDGET - (first.vram_peak_mib - BUDGET) - 64]
    assert second.label == f"{FIT_LABEL} for {asked[1]:.0f} MiB" and second.is_feasible_ok
    assert "overshot" in second.search_reason
    assert len(asked) == 2  # an answer within the budget ends the baseline
    assert third.label is None and third.search_reason.startswith(("boundary:", "local:"))  # then the search's
    notes = Store(study).study_record().search_notes
    assert any(n.startswith(f"llama-fit-params for {asked[1]:.0f} MiB: stand-in") for n in notes)
    assert any("measured its answer within the budget" in n for n in notes)


def test_without_an_answer_the_reason_is_noted_and_the_search_goes_on(planted, monkeypatch):
    monkeypatch.setattr(ReplayEngine, "baseline", lambda self, *a: "no GPU: no llama-fit-params baseline")
    study = sweep(parse_campaign(_spec(planted, trials=2)), storage=MEMORY_STORAGE, progress=False).study
    trials = Store(study).records()
    assert all(t.label is None for t in trials) and trials[0].search_reason.startswith("boundary:")
    assert "no GPU: no llama-fit-params baseline" in Store(study).study_record().search_notes


def test_a_partial_layer_runs_as_llama_fit_params_wrote_it(planted):
    """llama-fit-params fills the GPU tensor by tensor: beside whole layers it can leave one layer's down projection
    in RAM (its 12 GiB answer on an H100). `last N` would drop that tensor and need more memory than the answer."""
    campaign = parse_campaign(_spec(planted))
    ctx = SearchContext.create(campaign, base.create("replay", table=str(planted)), {str(planted): str(planted)})
    searched = {"placement": None, "cpu_expert_layers": None, "ubatch": None}
    whole = expert_override(range(22, N_LAYERS))
    partial = (r"blk\.21\.ffn_down.*=CPU", *whole)

    class Answer:
        def __init__(self, patterns):
            self.patterns = patterns

        def baseline(self, *args):
            return Baseline(41, self.patterns, None, "stand-in")

    ctx.engine = Answer(whole)
    params, fields = fit_params_trial(ctx, str(planted), searched, {"ubatch": 512}, BUDGET)
    assert params == {"placement": "last", "cpu_expert_layers": N_LAYERS - 22, "ubatch": 512} and fields == {}
    ctx.engine = Answer(partial)
    params, fields = fit_params_trial(ctx, str(planted), searched, {"ubatch": 512}, BUDGET)
    assert fields == {"fit_override_tensors": partial} and params["cpu_expert_layers"] == 0
    assert rf"\.{EXPERT_TENSORS}=CPU" in partial[1]
    # with partial_experts in the space the answer is a point of it, which the search reasons about
    spec = _spec(planted)
    spec["space"]["partial_experts"] = [0, 1, 2]
    ctx.campaign = parse_campaign(spec)
    params, fields = fit_params_trial(ctx, str(planted), {**searched, "partial_experts": None}, {"ubatch": 512}, BUDGET)
    assert params == {"placement": "last", "cpu_expert_layers": N_LAYERS - 22, "partial_experts": 1, "ubatch": 512}
    assert fields == {}
    ctx.engine = Answer((r"blk\.20\.ffn_down.*=CPU", *whole))  # not the layer next to the whole ones: raw
    assert fit_params_trial(ctx, str(planted), {**searched, "partial_experts": None}, {"ubatch": 512},
                            BUDGET)[1] != {}


@pytest.mark.parametrize("cores, threads, kept", [
    (16, 16, []), (6, 12, ["threads 12 (llama.cpp's default 6 is not among the campaign's values)"])])
def test_the_baseline_runs_the_other_knobs_as_llama_cpp_does(cores, threads, kept, monkeypatch):
    """What a user gets from `llama-server --fit on`: mmap and llama.cpp's thread count (the host's physical cores,
    a 16- and a 6-core stand-in here), not the search's starting values (-lm none, the middle thread count), which
    ran fit's 8 GiB answer on an H100 at 60 tok/s against 70 with llama.cpp's defaults."""
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: cores if not logical else 2 * cores)
    campaign = parse_campaign({"name": "x", "engine": "llama-bench", "model": "stand-in.gguf",
                               "space": {"threads": [8, 12, 16], "load_mode": ["none", "mmap"], "ubatch": [256, 512],
                                         "type_k": ["q8_0", "q4_0"]}, "constraints": {"vram_mib": BUDGET}})
    start = {"threads": 12, "load_mode": "none", "ubatch": 256, "type_k": "q8_0"}
    params, left = as_llama_runs_it(SimpleNamespace(campaign=campaign), start)
    assert params == {"threads": threads, "load_mode": "mmap", "ubatch": 512, "type_k": "q8_0"}
    assert left == ["type_k q8_0 (llama.cpp's default f16 is not among the campaign's values)", *kept]


def test_status_names_llama_fit_params_answer_in_the_confirmation(planted, monkeypatch):
    peaks = _last_peaks(planted)
    count = int(peaks[peaks <= BUDGET].index.min())
    monkeypatch.setattr(ReplayEngine, "baseline", lambda self, *a: Baseline(
        41, expert_override(cpu_expert_layers("last", count, N_LAYERS)), None, "stand-in"))
    spec = {**_spec(planted), "confirm": {"enabled": True, "top_k": 2, "rounds": 3}}
    study = sweep(parse_campaign(spec), storage=MEMORY_STORAGE, progress=False).study
    confirmed = Store(study).study_record().confirmed
    assert 0 in {f.trial for f in confirmed.finalists}  # trial 0, the baseline, whatever its rank
    console = Console(width=250, record=True, file=io.StringIO())
    print_status(console, study)
    assert "trial 0 (llama-fit-params' answer)" in console.export_text()
