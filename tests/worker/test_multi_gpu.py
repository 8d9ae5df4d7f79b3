"""Workers that see several GPUs search llama.cpp's split knobs and the per-GPU expert split; the knobs reach
llama-bench and llama-server as flags and `=CUDAk` tensor overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution

from autoinfer.campaign import plan as campaign_plan
from autoinfer.campaign.space import distributions, to_config
from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.coordination import worker
from autoinfer.engines.base import TrialConfig
from autoinfer.engines.llama_bench import LlamaBenchEngine
from autoinfer.engines.llama_common import bench_args_for, server_args
from autoinfer.errors import UserError
from autoinfer.model.memory import MemoryModel
from autoinfer.model.placement import (
    EXPERT_TENSORS,
    device_bytes,
    gpu_expert_override,
    layer_devices,
    placement_bytes,
    realize,
)
from autoinfer.model.shape import ModelShape, shape_from_gguf

H200X2 = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "h200x2-35b-experts.csv"


def campaign(**space):
    return parse_campaign({"name": "x", "model": "/m/a.gguf", "space": {"n_cpu_moe": [0, 8], **space}})


def test_split_knobs_are_searched_only_with_several_gpus():
    c = campaign()
    assert campaign_plan.multi_gpu_space(c, n_gpus=1) == c
    assert campaign_plan.multi_gpu_space(c) == c  # this machine: CPU only
    two = campaign_plan.multi_gpu_space(c, n_gpus=2)
    check_space(two, LlamaBenchEngine.knobs)
    dists = distributions(two)
    assert "split_mode" not in dists  # llama.cpp's default (layer): row and tensor fail on qwen35moe (see hardware)
    assert dists["tensor_split"] == CategoricalDistribution(["1/1", "2/1", "1/2"])
    assert dists["expert_split"] == CategoricalDistribution(["layers", "1/1", "2/1", "1/2"])  # experts are placed
    no_placement = parse_campaign({"name": "x", "model": "/m/a.gguf", "space": {"threads": [1, 2]}})
    assert "expert_split" not in campaign_plan.multi_gpu_space(no_placement, n_gpus=2).space
    assert campaign_plan.split_choices(3) == ["1/1/1", "2/1/1", "1/1/2"]
    # a campaign that sets a knob keeps its own choice
    assert campaign_plan.multi_gpu_space(campaign(split_mode="row"), n_gpus=2).space["split_mode"] == "row"


def test_split_knobs_become_flags():
    two = campaign_plan.multi_gpu_space(campaign(), n_gpus=2)
    config = to_config(two, {"n_cpu_moe": 8, "split_mode": "row", "tensor_split": "2/1"}, {"/m/a.gguf": "/m/a.gguf"})
    argv = bench_args_for(config, None)
    assert argv[argv.index("-sm") + 1] == "row" and argv[argv.index("-ts") + 1] == "2/1"
    served = server_args(config)
    assert served[served.index("-ts") + 1] == "2,1"  # llama-server separates with commas


@pytest.mark.parametrize("space, needle", [
    ({"split_mode": ["layer", "diagonal"]}, "space.split_mode: 'diagonal' is not valid"),
    ({"tensor_split": ["1,1"]}, "space.tensor_split: '1,1' is not valid"),
    ({"main_gpu": -1}, "space.main_gpu: -1 is not valid"),
    ({"expert_split": ["layers", "half"]}, "space.expert_split: 'half' is not valid"),
])
def test_bad_split_values_name_the_key(space, needle):
    with pytest.raises(UserError, match=needle):
        check_space(campaign(**space), LlamaBenchEngine.knobs)


def test_expert_split_gives_each_gpu_a_contiguous_run_of_device_experts():
    assert gpu_expert_override([4, 5, 6, 7, 8, 9], "2/1") == (
        rf"blk\.(4|5|6|7)\.{EXPERT_TENSORS}=CUDA0", rf"blk\.(8|9)\.{EXPERT_TENSORS}=CUDA1")
    assert gpu_expert_override([4, 5], "1/0") == (rf"blk\.(4|5)\.{EXPERT_TENSORS}=CUDA0",)
    # 12 layers, the first 2 by -ncmoe and the last 3 by the pattern stay in RAM; -ngl 10 leaves layers 0-2 on the CPU
    config = TrialConfig.from_params({"model": "/m/a.gguf", "n_gpu_layers": 10, "n_cpu_moe": 2, "placement": "last",
                                      "cpu_expert_layers": 3, "expert_split": "1/1"})
    real = realize(config, 12)
    assert real.extra == ()  # every placement knob became an override
    assert real.override_tensors == (rf"blk\.(9|10|11)\.{EXPERT_TENSORS}=CPU",  # CPU first: llama.cpp's first match
                                     rf"blk\.(3|4|5)\.{EXPERT_TENSORS}=CUDA0", rf"blk\.(6|7|8)\.{EXPERT_TENSORS}=CUDA1")
    assert realize(config.with_(extra=(("expert_split", "layers"),)), 12).override_tensors == ()
    argv = bench_args_for(real, None)
    assert argv[argv.index("-ot") + 1] == ";".join(real.override_tensors)  # llama-bench's separator
    served = server_args(real)
    assert served[served.index("-ot") + 1] == ",".join(real.override_tensors)  # no pattern holds a comma


def test_experts_sent_to_a_second_gpu_count_as_device_memory(tiny_model):
    shape = shape_from_gguf(tiny_model)
    everything = placement_bytes(shape, 99, 0, (), gpu=True).gpu_bytes
    on_cpu = placement_bytes(shape, 99, 0, (rf"blk\.(0|1)\.{EXPERT_TENSORS}=CPU",), gpu=True).gpu_bytes
    on_cuda1 = placement_bytes(shape, 99, 0, (rf"blk\.(0|1)\.{EXPERT_TENSORS}=CUDA1",), gpu=True).gpu_bytes
    assert on_cpu < on_cuda1 == everything


def test_layers_are_cut_as_llama_cpp_cuts_them(tiny_model):
    # 40 layers + output, -ts 1/1: layers 0-20 on the first GPU, 21-39 and the output on the second (measured on the
    # H200s: CUDA0 9514 MiB, CUDA1 8879 MiB of model buffers)
    assert layer_devices(40, 99, (1, 1)) == [0] * 21 + [1] * 20
    assert layer_devices(40, 20, (1, 1)) == [None] * 21 + [0] * 10 + [1] * 10  # -ngl 20: the last 19 and the output
    assert layer_devices(4, 99, (2, 1)) == [0, 0, 0, 0, 1]
    shape = shape_from_gguf(tiny_model)
    for ngl, overrides, shares in [(99, (), (1, 1)), (3, (), (1, 2)), (99, gpu_expert_override([0, 1, 2], "1/2"), (1, 1)),
                                   (99, (rf"blk\.1\.{EXPERT_TENSORS}=CPU",), (3, 1))]:
        assert sum(device_bytes(shape, ngl, 1, overrides, shares)) == placement_bytes(shape, ngl, 1, overrides).gpu_bytes


def _h200_configs() -> list[tuple[TrialConfig, list[float]]]:
    meta = json.loads(H200X2.with_suffix(".meta.json").read_text())
    rows = pd.read_csv(H200X2).to_dict("records")
    return [(realize(TrialConfig.from_params({**meta["fixed"], "model": "m", "n_prompt": meta["n_prompt"],
                                               "n_gen": meta["n_gen"], "tensor_split": r["tensor_split"],
                                               "expert_split": r["expert_split"]}), 40),
             [r["vram_gpu0_mib"], r["vram_gpu1_mib"]]) for r in rows]


def test_memory_model_predicts_each_gpu_of_the_h200_pair():
    """Measured on 2 × H200: the prior is within 600 MiB on every GPU (it guesses 300 MiB of CUDA context per GPU,
    the H200s take about 690), three calibrating runs bring the other three within 3%."""
    shape = ModelShape.from_json(H200X2.with_name(H200X2.stem + ".shape.json").read_text())
    model = MemoryModel(shape, "device", n_devices=2)
    runs = _h200_configs()
    for config, peaks in runs:
        predicted = model.predict(config)
        assert len(predicted.per_device) == 2 and predicted.mib == max(predicted.per_device)
        assert all(abs(p - y) < 600 for p, y in zip(predicted.per_device, peaks)), (predicted, peaks)
    model.calibrate(runs[:3])
    for config, peaks in runs[3:]:
        assert all(abs(p - y) / y < 0.03 for p, y in zip(model.predict(config).per_device, peaks))


def _pair_sweep(tmp_path: Path, vram_mib: int, trials: int) -> list:
    """The boundary search replaying the H200 pair's table (the last 24 layers' experts in RAM, both splits
    searched)."""
    from autoinfer.store.trials import Store
    from autoinfer.sweep.replay_cli import OFFLINE
    from autoinfer.sweep.runner import sweep

    (tmp_path / "m").write_text("replay label\n")  # the environment record fingerprints the model file it names
    c = parse_campaign({"name": "pair", "engine": "replay", "engine_options": {"table": str(H200X2)},
                        "model": str(tmp_path / "m"),
                        "space": {"placement": "last", "cpu_expert_layers": 24, "tensor_split": ["1/1", "2/1"],
                                  "expert_split": ["layers", "1/1", "2/1"]},
                        "constraints": {"vram_mib": vram_mib}, "budget": {"trials": trials},
                        "search": {"fit_params": False, "prune_below": None}, **OFFLINE})
    return Store(sweep(c, storage="memory", progress=False).study).records()


def test_informed_search_on_two_gpus_fits_every_gpu(tmp_path):
    """Within 6 GiB per GPU every measured trial fits each GPU, and no split that leaves one GPU over it (experts
    following the layers, 7.4-8.6 GiB on the first GPU in the table) is run."""
    trials = _pair_sweep(tmp_path, 6144, 3)
    measured = [t for t in trials if t.status == "ok"]
    assert len(measured) == 3 and all(max(t.vram_per_gpu_mib) <= 6144 for t in measured)
    assert all(t.params["expert_split"] != "layers" for t in trials if t.status != "predicted_infeasible")


def test_the_splits_are_moves_of_the_boundary_search(tmp_path):
    """The splits move like the other knobs: the table's splits differ by up to 15% in generation at the same bytes
    on the GPUs, which no model predicts. Before they were moves, the search measured one split, handed the next
    trial to the sampler and measured the first again: 6 trials to the best feasible row (10 seeds) against random
    search's 4 (benchmarks/results/search-efficiency.md)."""
    trials = _pair_sweep(tmp_path, 8192, 3)
    assert [t.search_reason.split(":")[0] for t in trials] == ["start", "local", "local"]
    assert len({(t.params["tensor_split"], t.params["expert_split"]) for t in trials}) == 3


@pytest.mark.parametrize("space, n_gpus, needle", [
    ({"tensor_split": ["1/1/1"]}, 2, "space.tensor_split: '1/1/1' gives 3 GPU share"),
    ({"expert_split": "2/1"}, 0, "space.expert_split: '2/1' gives 2 GPU share.* sees 0 GPU"),
])
def test_a_split_for_gpus_the_worker_does_not_see_is_refused(space, n_gpus, needle):
    with pytest.raises(UserError, match=needle):
        campaign_plan.multi_gpu_space(campaign(**space), n_gpus=n_gpus)
    assert campaign_plan.multi_gpu_space(campaign(expert_split="layers"), n_gpus=0).space["expert_split"] == "layers"


def test_gpus_option_takes_single_gpus_and_groups():
    assert worker.parse_gpus("0,1") == ["0", "1"]
    assert worker.parse_gpus("0+1, 2+3") == ["0,1", "2,3"]
    for bad in ("0,0", "0+1,1", "a", ""):
        with pytest.raises(UserError, match="--gpus"):
            worker.parse_gpus(bad)
