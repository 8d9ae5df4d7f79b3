"""On a machine with two NVIDIA GPUs and a CUDA llama.cpp build (AUTOINFER_LLAMA_BIN or `autoinfer build --cuda`):
the tensor split and the per-GPU expert overrides load in real llama-bench runs, and each GPU's peak is measured.

The model is the 35B-A3B-shaped Q4_K stand-in (18 GiB, synthesized once per machine): on a small model the CUDA
context and warm-up buffers (~500-700 MiB per GPU) hide the weights, so nothing about placement could be seen.
"""

from __future__ import annotations

import pytest

from autoinfer.engines import base
from autoinfer.engines.base import RunContext, TrialConfig
from autoinfer.measure.gpu import list_gpus, measured_gpus
from autoinfer.model.placement import cpu_expert_layers, expert_override, placement_bytes, realize
from autoinfer.model.shape import shape_from_gguf
from autoinfer.model.synth import cached_model

pytestmark = pytest.mark.skipif(len(list_gpus()) < 2 or min((g.memory_total_mib for g in list_gpus()), default=0)
                                < 20_000, reason="needs two NVIDIA GPUs with 20 GB each")
MIB = 2 ** 20
CPU_LAYERS = 24  # the last 24 layers' experts in RAM: the second GPU's layers lose their experts


@pytest.fixture(scope="module")
def bench():
    from autoinfer.llama.build import find_tools

    if not find_tools().cuda:
        pytest.skip("needs a CUDA llama.cpp build (AUTOINFER_LLAMA_BIN or `autoinfer build --cuda`)")
    model = cached_model("35b-a3b", "Q4_K")
    engine = base.create("llama-bench")
    engine.check()
    return engine, model, shape_from_gguf(model)


@pytest.fixture(scope="module")
def runs(bench, tmp_path_factory):
    engine, model, shape = bench
    folder = tmp_path_factory.mktemp("runs")
    placed = {"placement": "last", "cpu_expert_layers": CPU_LAYERS, "tensor_split": "1/1"}
    knobs = {"single": {"split_mode": "none"}, "even": {"tensor_split": "1/1"}, "first_heavy": {"tensor_split": "2/1"},
             "with_layers": {**placed, "expert_split": "layers"}, "balanced": {**placed, "expert_split": "1/1"},
             "all_first": {**placed, "expert_split": "1/0"}, "all_second": {**placed, "expert_split": "0/1"}}
    out = {}
    for name, extra in knobs.items():
        params = {"model": str(model), "n_gpu_layers": 99, "n_prompt": 128, "n_gen": 16, "repetitions": 1,
                  "flash_attn": "on", **extra}
        m = engine.run(realize(TrialConfig.from_params(params), shape.n_layers),
                       RunContext(timeout_s=300, artifacts=folder, gpus=measured_gpus()[:2]))
        assert m.ok, f"{name}: {m.outcome.value}: {m.reason} {m.stderr[-800:]}"
        assert len(m.vram_per_gpu_mib) == 2 and m.vram_peak_mib == max(m.vram_per_gpu_mib)
        out[name] = m.vram_per_gpu_mib
    return out


def test_tensor_split_shares_the_layers(runs):
    first, second = runs["single"]
    assert second < 0.1 * first  # -sm none: everything on the main GPU
    assert 0.8 < runs["even"][0] / runs["even"][1] < 1.25
    assert runs["first_heavy"][0] > 1.6 * runs["first_heavy"][1]


def test_expert_split_moves_the_device_experts(bench, runs):
    _, _, shape = bench
    on_device = (placement_bytes(shape, 99, 0, expert_override(cpu_expert_layers("last", CPU_LAYERS, shape.n_layers)),
                                 gpu=True).gpu_bytes
                 - placement_bytes(shape, 99, 0, expert_override(range(shape.n_layers)), gpu=True).gpu_bytes) / MIB
    moved = runs["all_first"][0] - runs["all_second"][0]
    assert 0.9 * on_device < moved < 1.1 * on_device, (moved, on_device, runs)
    assert 0.9 * on_device < runs["all_second"][1] - runs["all_first"][1] < 1.1 * on_device
    # with experts following their layers, the GPU whose layers kept their experts carries them all
    lopsided, balanced = runs["with_layers"], runs["balanced"]
    assert max(lopsided) > 3 * min(lopsided)
    assert max(balanced) < 1.2 * min(balanced) and max(balanced) < 0.7 * max(lopsided)
