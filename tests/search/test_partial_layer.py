"""Part of one more layer's FFN in RAM as a searched placement (`partial_experts`, model/placement.py), as
llama-fit-params places the layer at its boundary: where the next whole layer does not fit, the search keeps only
that layer's down projections in RAM instead of all its experts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.model.placement import EXPERT_TENSORS, PARTIAL_TENSORS, overridden, realize
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.replay_cli import OFFLINE
from autoinfer.sweep.runner import sweep

from .planted import N_LAYERS, planted_table, shape_35b

NAMES = [t.name for t in shape_35b().tensors]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return planted_table(tmp_path_factory.mktemp("planted"), partial=True)


def _moved(**knobs) -> dict[str, int | None]:
    config = realize(TrialConfig(model=Path("m"), extra=tuple(knobs.items())), N_LAYERS)
    return overridden(config.override_tensors, NAMES)


@pytest.mark.parametrize("pattern, layer", [("last", N_LAYERS - 5), ("first", 4), ("even", 0)])
def test_the_part_is_of_the_layer_the_pattern_puts_in_ram_next(pattern, layer):
    whole, down = _moved(placement=pattern, cpu_expert_layers=4), _moved(placement=pattern, cpu_expert_layers=4,
                                                                         partial_experts=1)
    assert set(down) - set(whole) == {f"blk.{layer}.ffn_down_exps.weight", f"blk.{layer}.ffn_down_shexp.weight"}
    gate = set(_moved(placement=pattern, cpu_expert_layers=4, partial_experts=2)) - set(whole)
    assert {n.split(".")[2] for n in gate} == {"ffn_down_exps", "ffn_gate_exps", "ffn_down_shexp",
                                                "ffn_gate_shexp", "ffn_gate_inp"}  # what fit's pattern moves
    assert all(n.startswith(f"blk.{layer}.") for n in gate)


def test_no_part_where_no_layer_is_left_and_ncmoe_layers_count_as_in_ram():
    assert _moved(placement="last", cpu_expert_layers=N_LAYERS, partial_experts=2) == \
        _moved(placement="last", cpu_expert_layers=N_LAYERS)
    config = realize(TrialConfig(model=Path("m"), n_cpu_moe=3, extra=(("partial_experts", 1),)), N_LAYERS)
    assert config.override_tensors == (rf"blk\.3\.{PARTIAL_TENSORS[1]}=CPU",)


def _budget(planted: Path) -> float:
    """Between 16 layers' experts in RAM with one more layer's down projections (fits) and without them (over)."""
    df = pd.read_csv(planted)
    rows = df[(df.n_gpu_layers == 41) & (df.placement == "last") & (df.cpu_expert_layers == 16) & (df.ubatch == 512)]
    peaks = rows.set_index("partial_experts").vram_mib
    assert peaks[0] - peaks[1] > 120
    return float(peaks[1] + 60)


def _sweep(planted: Path, partial: list[int], trials: int = 8):
    spec = {"name": "partial", "engine": "replay", "engine_options": {"table": str(planted)}, "model": str(planted),
            "space": {"n_gpu_layers": 41, "placement": ["last", "first"],
                      "cpu_expert_layers": {"low": 0, "high": N_LAYERS, "step": 2}, "partial_experts": partial,
                      "ubatch": [512, 1024]},  # 256 would fit 16 whole layers
            "constraints": {"vram_mib": _budget(planted)}, "budget": {"trials": trials}, "objective": "tg",
            "search": {"informed": True, "strategy": "boundary"}, **OFFLINE}
    return Store(sweep(parse_campaign(spec), storage=MEMORY_STORAGE, progress=False).study).records()


def test_the_search_keeps_part_of_a_layer_in_ram_where_the_whole_layer_does_not_fit(planted):
    """16 layers' experts and the down (or gate and down) projections of one more read fewer host bytes than 18
    layers', the most whole layers that fit."""
    trials = _sweep(planted, [0, 1, 2])
    best = max((t for t in trials if t.is_feasible_ok), key=lambda t: t.value)
    assert best.params["cpu_expert_layers"] == 16 and best.params["partial_experts"] in (1, 2), best.params
    whole = _sweep(planted, [0])
    best_whole = max((t for t in whole if t.is_feasible_ok), key=lambda t: t.value)
    assert best_whole.params["cpu_expert_layers"] == 18 and best.value > best_whole.value
