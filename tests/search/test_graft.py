"""llama-fit-params' tensor-level placement grafted onto the search's knobs (search/graft.py). llama-fit-params and
a run of its raw overrides need a GPU, so stand-ins answer from the planted table's own truth: the memory the
planted table's peaks were drawn from and its speed formula, with the part of a layer in RAM counted by its bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.base import Baseline, Measurement, Outcome, TrialConfig
from autoinfer.engines.replay import ReplayEngine
from autoinfer.model.memory import MemoryModel
from autoinfer.model.placement import expert_override
from autoinfer.search.effects import KnobEffects
from autoinfer.search.graft import graft
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.progress import describe
from autoinfer.sweep.replay_cli import OFFLINE
from autoinfer.sweep.runner import sweep

from .planted import N_LAYERS, planted_speeds, planted_table, shape_35b

BUDGET = 13100.0  # the last 20 layers' experts in RAM fit at ubatch 512, not at 1024; fit's answer fits at both
WHOLE = 20
PARTIAL = (rf"blk\.{N_LAYERS - WHOLE - 1}\.ffn_(down|gate)_exps.*=CPU", *expert_override(range(N_LAYERS - WHOLE,
                                                                                               N_LAYERS)))
PART = (220 + 151) / (151 + 151 + 220)  # down and gate: the share of that layer's expert bytes left in RAM


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return planted_table(tmp_path_factory.mktemp("planted"))


def test_fit_placement_is_grafted_onto_the_knobs_the_search_found(planted, monkeypatch):
    truth = MemoryModel(shape_35b(), "device")
    ran = []

    def run(self, config, ctx):
        if not config.override_tensors:
            return replay(self, config, ctx)
        ran.append(config)  # llama-fit-params' overrides, as llama-bench would run them
        tg, pp = planted_speeds(WHOLE + PART, 0, False, config.ubatch)
        return Measurement(Outcome.OK, tg_samples=(tg,) * 3, pp_samples=(pp,) * 3,
                           vram_peak_mib=truth.predict(config).mib * 1.04 + 250)

    replay = ReplayEngine.run
    monkeypatch.setattr(ReplayEngine, "run", run)
    monkeypatch.setattr(ReplayEngine, "baseline", lambda self, *a: Baseline(41, PARTIAL, None, "stand-in"))
    spec = {"name": "graft", "engine": "replay", "engine_options": {"table": str(planted)}, "model": str(planted),
            "space": {"n_gpu_layers": 41, "placement": ["first", "last", "even"],
                      "cpu_expert_layers": {"low": 0, "high": N_LAYERS, "step": 2}, "ubatch": [256, 512, 1024]},
            "constraints": {"vram_mib": BUDGET}, "budget": {"trials": 8}, "objective": "pp",
            "search": {"informed": True, "strategy": "boundary", "fit_params": True}, **OFFLINE}
    study = sweep(parse_campaign(spec), storage=MEMORY_STORAGE, progress=False).study
    trials = Store(study).records()
    assert trials[0].fit_override_tensors == PARTIAL and trials[0].is_feasible_ok and trials[0].params["ubatch"] == 512
    grafts = [t for t in trials if str(t.search_reason or "").startswith("graft:")]
    assert len(grafts) == 1, [t.search_reason for t in trials]
    g = grafts[0]
    assert g.fit_override_tensors == PARTIAL and g.is_feasible_ok and g.params["ubatch"] == 1024
    assert [c.ubatch for c in ran] == [512, 1024]  # the baseline, then the graft, each run with fit's overrides
    assert f"trial 0's placement (llama-fit-params' {len(PARTIAL)} overrides)" in g.search_reason
    assert "ubatch 512 → 1024" in g.search_reason
    incumbent = int(g.search_reason.split("with trial ")[1].split("'s knobs")[0])
    assert trials[incumbent].params["ubatch"] == 1024 and trials[incumbent].fit_override_tensors is None
    assert g.value > trials[incumbent].value  # fit's placement with the knobs the search found beat them on its own
    # named (status, the progress line, the recommendation) by what it ran, not by the placement parameters it
    # carries to be a point of the space
    assert describe(g.shown_params).startswith(f"override_tensors=llama-fit-params' {len(PARTIAL)} ubatch=1024")


def test_a_graft_measured_over_the_budget_makes_the_next_like_one_predicted_over(tmp_path):
    """The next graft's peak is carried over from the measured peak of the same placement whose predicted difference
    is surest, an over-budget graft included: the baseline alone (ubatch 512, well within) would put ubatch 1024 with
    other threads within the budget again, one trial over it for each thread count."""
    model = tmp_path / "m.gguf"
    memory = MemoryScreen(ctx=None, models={str(model): MemoryModel(shape_35b(), "device")})

    def trial(number, ubatch, threads, peak, outcome):
        config = TrialConfig(model=model, ubatch=ubatch, threads=threads, override_tensors=PARTIAL)
        return TrialRecord(number, TrialState.COMPLETE, params={"ubatch": ubatch, "threads": threads},
                           values=(7000.0,), config=config.to_params(), outcome=outcome, pp_samples=(7000.0,) * 3,
                           tg_samples=(50.0,) * 3, vram_peak_mib=peak, fit_override_tensors=PARTIAL)

    effects = KnobEffects({"ubatch": [256, 512, 1024], "threads": [8, 16]}).fit([])
    base = trial(0, 512, 16, 12400.0, "ok")
    args = (3, {"ubatch": 1024, "threads": 8}, 6500.0, ["ubatch", "threads"], effects, memory, BUDGET, {"pp": 1.0},
            lambda a, b: 0.0)
    first = graft([base], *args)
    assert first is not None and first.params == {"ubatch": 1024, "threads": 8}
    over = trial(1, 1024, 16, BUDGET + 400.0, "infeasible")  # an earlier graft, measured over
    assert graft([base, over], *args) is None
