"""The reference engine's knobs are declared once (refengine/options.py): campaign values and command-line strings
convert to the same typed options, the worker's flags round-trip, and the campaign engine refuses what the engine
would refuse before starting a process."""

from __future__ import annotations

import argparse

import pytest

from autoinfer.engines import base
from autoinfer.engines.base import TrialConfig
from autoinfer.errors import UserError
from autoinfer.refengine.options import KNOBS, EngineOptions, add_arguments, from_namespace


def test_values_convert_to_the_fields_types():
    options = EngineOptions.from_knobs({"graphs": "on", "snapshots": False, "prefetch": True, "expert_slots": "12",
                                        "budget_mib": 8192, "torch_threads": None, "gdn": "triton_chunk"})
    assert options.graphs is True and options.snapshots is False and options.prefetch == 1
    assert options.expert_slots == 12 and options.budget_mib == 8192.0 and options.torch_threads is None
    assert EngineOptions.from_knobs({"graphs": "off"}).graphs is False


@pytest.mark.parametrize("values, words", [
    ({"graph": "on"}, "not a reference-engine knob"),
    ({"graphs": "maybe"}, "graphs: 'maybe' is not a valid bool"),
    ({"expert_slots": 2.5}, "expert_slots"),
    ({"prefetch": "far"}, "prefetch"),
])
def test_bad_values_name_the_knob(values, words):
    with pytest.raises(UserError, match=words):
        EngineOptions.from_knobs(values)


def test_worker_flags_round_trip():
    options = EngineOptions(device="cuda", weights="gguf", moe="fused", gdn="triton_chunk", graphs=True, prefetch=2,
                            budget_mib=4096.5, max_context=600)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_namespace(parser.parse_args(options.to_argv())) == options
    assert EngineOptions().to_argv() == []  # defaults need no flag
    assert set(KNOBS) <= set(base.create("reference").knobs)


@pytest.mark.parametrize("values, words", [
    ({"moe": "fused"}, "weights: gguf"),
    ({"budget_mib": 1000, "expert_slots": 4}, "not both"),
    ({"prefetch": -1}, "prefetch"),
    ({"misses": "gpu"}, "misses 'gpu' is not one of copy, cpu"),
    ({"misses": "cpu"}, "set expert_slots or budget_mib"),
    ({"misses": "cpu", "expert_slots": 4, "graphs": "on"}, "use misses: copy"),
    ({"misses": "cpu", "budget_mib": 8192, "graphs": "on"}, "use misses: copy"),
])
def test_refused_combinations(values, words):
    with pytest.raises(UserError, match=words):
        EngineOptions.from_knobs(values).check()


def test_the_campaign_engine_refuses_before_running(tmp_path):
    import torch

    engine = base.create("reference")
    config = TrialConfig.from_params({"model": str(tmp_path / "m.gguf"), "graphs": "on", "moe": "fused",
                                      "weights": "gguf", "gdn": "fused_recurrent"})
    reason = engine.refusal(config)
    assert reason and ("needs device: cuda" in reason or torch.cuda.is_available())
    assert engine.refusal(TrialConfig.from_params({"model": str(tmp_path / "m.gguf")})) is None
    assert "graphs" in engine.refusal(TrialConfig.from_params({"model": "m.gguf", "graphs": "sometimes"}))
