"""The informed search on a planted table: fewer trials than random search, predicted-infeasible records, labels,
pruning, and llama-fit-params' answer parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.llama_common import parse_fit_params
from autoinfer.model.placement import layers_on_cpu
from autoinfer.store.trials import Store
from autoinfer.sweep.replay_cli import OFFLINE, compare
from autoinfer.sweep.runner import sweep

from .planted import planted_table, shape_35b

BUDGET = 16384


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return planted_table(tmp_path_factory.mktemp("planted"))


def test_informed_and_boundary_need_a_quarter_of_random_trials(planted):
    results, _ = compare(planted, ["random", "informed", "boundary"], seeds=8, budget_mib=BUDGET, trials=40)
    random, *knowing = results
    for strategy in knowing:
        assert strategy.median * 4 <= random.median, (random.trials_needed, strategy.strategy, strategy.trials_needed)
        assert sum(n is not None for n in strategy.trials_needed) >= 7


def _campaign(planted: Path, **search) -> dict:
    return {"name": "informed", "engine": "replay", "engine_options": {"table": str(planted)}, "model": str(planted),
            "space": {"n_gpu_layers": [28, 32, 36, 41], "placement": ["first", "last", "even"],
                      "cpu_expert_layers": {"low": 0, "high": 40, "step": 2}, "ubatch": [256, 512, 1024]},
            "constraints": {"vram_mib": BUDGET}, "budget": {"trials": 20},
            "search": {"fit_params": False, **search}, **OFFLINE}


def test_sweep_records_predictions_labels_and_pruning(planted):
    result = sweep(parse_campaign(_campaign(planted, strategy="informed")), storage="memory", progress=False)
    trials = Store(result.study).records()
    outcomes = [t.status for t in trials]
    measured = [t for t in trials if t.is_finished]
    assert len(measured) == 20  # predicted-infeasible records do not use up the budget
    skipped = [t for t in trials if t.status == "predicted_infeasible"]
    assert skipped and all("predicted" in t.reason and t.constraints.get("memory") == 1.0 for t in skipped)
    assert all(t.predicted_mib > BUDGET for t in skipped)
    labels = [t.label for t in trials[:3]]
    assert labels[0] == "informed: largest placement predicted to fit" and "informed: neighbour" in labels
    first = trials[0]
    assert first.vram_peak_mib <= BUDGET * 1.05  # the informed start sits near the edge, not over
    assert "pruned" in outcomes  # hopeless configurations are cut after one repetition
    assert all(len(t.samples("tg")) == 1 for t in trials if t.status == "pruned")
    memory = Store(result.study).study_record().memory_model[planted.name]
    assert memory.trials >= 10 and memory.loo_median_rel_error < 0.05


def test_without_skipping_the_over_budget_trials_run(planted):
    result = sweep(parse_campaign(_campaign(planted, skip_predicted=False, informed=False, prune_below=None)),
                   storage="memory", progress=False)
    trials = Store(result.study).records()
    assert not any(t.status == "predicted_infeasible" for t in trials)
    assert any(t.status == "infeasible" for t in trials)


FIT_OUTPUT = ("-c 4096 -ngl 41 -ot \"" + ",".join(
    rf"blk\.{i}\.ffn_(up|down|gate)_(ch|)exps=CPU" for i in range(30, 40)) + "\"\n")


def test_fit_params_answer_is_parsed_into_a_placement():
    ngl, patterns, split = parse_fit_params("llama_params_fit: done\n" + FIT_OUTPUT)
    assert ngl == 41 and len(patterns) == 10 and split is None
    assert layers_on_cpu(patterns, shape_35b().tensor_names) == frozenset(range(30, 40))
    assert parse_fit_params("-c 512 -ngl 99\n") == (99, (), None)
    assert parse_fit_params("-c 512 -ngl 41 -ts 25,16\n") == (41, (), "25/16")
    with pytest.raises(ValueError):
        parse_fit_params("error: failed to fit\n")


def test_fit_params_tensor_split_keeps_the_trials_placement(tiny_model, llama_tools):
    """llama-fit-params' -ts on several GPUs replaces the trial's tensor split and nothing else."""
    import optuna

    from autoinfer.campaign.space import distributions, to_config
    from autoinfer.engines import base
    from autoinfer.model.placement import EXPERT_TENSORS
    from autoinfer.search.context import SearchContext
    from autoinfer.search.realize import realize_trial
    from autoinfer.store.trials import record_of

    campaign = parse_campaign({"name": "x", "model": str(tiny_model), "space": {
        "placement": ["last"], "cpu_expert_layers": [2], "tensor_split": ["1/1"]}})
    models = {str(tiny_model): str(tiny_model)}
    ctx = SearchContext.create(campaign, base.create("llama-bench"), models)
    study = optuna.create_study()
    Store(study).enqueue({"placement": "last", "cpu_expert_layers": 2, "tensor_split": "1/1"},
                         fit_tensor_split="17/24")
    dists = distributions(campaign)
    trial = study.ask(dists)
    config = realize_trial(ctx, to_config(campaign, trial.params, models), record_of(trial))
    assert config.override_tensors == (rf"blk\.(2|3)\.{EXPERT_TENSORS}=CPU",)
    assert config.get("tensor_split") == "17/24"


@pytest.mark.parametrize("constraint, mib, expected", [("vram_mib", BUDGET, ("none", 1)), ("ram_mib", 65536, ("mmap", 0))])
def test_a_gpu_campaigns_informed_trials_load_without_mmap(planted, constraint, mib, expected):
    """On a memory-of-the-GPU budget the informed start loads without mmap, onto huge pages (a decode step reads the
    host's experts faster there); on a host budget it keeps llama.cpp's defaults."""
    import optuna

    from autoinfer.campaign.space import distributions
    from autoinfer.engines import base
    from autoinfer.search.context import SearchContext
    from autoinfer.search.informed import InformedStart
    from autoinfer.search.memory_screen import MemoryScreen

    spec = _campaign(planted)
    spec["space"]["load_mode"] = ["mmap", "none"]
    spec["space"]["huge_pages"] = [0, 1]
    spec["constraints"] = {constraint: mib}
    campaign = parse_campaign(spec)
    ctx = SearchContext.create(campaign, base.create("replay", table=str(planted)), {str(planted): str(planted)})
    study = optuna.create_study()
    start = InformedStart(ctx, MemoryScreen.create(ctx), distributions(campaign))
    assert start.enqueue(study, distributions(campaign)) >= 2
    queued = study.get_trials(deepcopy=False)
    assert {tuple(t.system_attrs["fixed_params"][k] for k in ("load_mode", "huge_pages")) for t in queued} == {expected}


def test_an_engine_that_places_its_own_memory_gets_no_llama_cpp_memory_model(tiny_model):
    """The reference engine sizes its expert cache to `budget_mib` itself: llama.cpp's memory model would predict
    the whole model on the device and skip every trial as over the budget (as it did on an H200 before)."""
    from autoinfer.engines import base
    from autoinfer.engines.base import TrialConfig
    from autoinfer.search.context import SearchContext
    from autoinfer.search.memory_screen import MemoryScreen

    model = str(tiny_model)
    for engine, screened in (("reference", False), ("llama-bench", True)):
        campaign = parse_campaign({"name": "c", "engine": engine, "model": model, "constraints": {"vram_mib": 1}})
        ctx = SearchContext.create(campaign, base.create(engine) if engine == "reference" else _llama(), {model: model})
        screen = MemoryScreen.create(ctx)
        config = TrialConfig.from_params({"model": model, "n_gpu_layers": 99})
        assert (screen.predict(config) is not None) is screened, engine
        if not screened:
            assert screen.skip(config) is None  # measured against the budget instead
        assert any("places its memory itself" in n for n in ctx.notes) is not screened


def _llama():
    """llama-bench's engine without its binaries: only its memory-related declarations are used here."""
    from autoinfer.engines.llama_bench import LlamaBenchEngine

    return LlamaBenchEngine.__new__(LlamaBenchEngine)


def test_a_one_gpu_table_replayed_on_a_host_of_four_gpus_is_predicted_for_one(planted, monkeypatch):
    """The memory model predicts the GPUs the trials' peaks come from: a replay table's, not this host's (on a
    four-GPU host every replayed placement was predicted at a quarter of its peak and measured over the budget)."""
    from autoinfer.engines import base
    from autoinfer.search import context
    from autoinfer.search.context import SearchContext

    monkeypatch.setattr(context, "measured_gpus", lambda: (0, 1, 2, 3))
    campaign = parse_campaign(_campaign(planted))
    replayed = SearchContext.create(campaign, base.create("replay", table=str(planted)), {str(planted): str(planted)})
    assert replayed.n_gpus == 1 and not any("GPUs:" in n for n in replayed.notes), replayed.notes
    measured = SearchContext.create(parse_campaign({"name": "c", "engine": "llama-bench", "model": str(planted),
                                                    "constraints": {"vram_mib": BUDGET}}), _llama(), {})
    assert measured.n_gpus == 4
