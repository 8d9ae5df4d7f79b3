"""Workers that see several GPUs search llama.cpp's split knobs; the knobs reach llama-bench and llama-server."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution

from autoinfer.campaign import hardware
from autoinfer.campaign.space import distributions, to_config
from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.llama_common import BENCH_EXTRAS, bench_args_for, server_args
from autoinfer.engines.base import TrialConfig
from autoinfer.errors import UserError

BENCH_SUPPORTED = TrialConfig.field_names() | frozenset(BENCH_EXTRAS)


def campaign(**space):
    return parse_campaign({"name": "x", "model": "/m/a.gguf", "space": {"n_cpu_moe": [0, 8], **space}})


def test_split_knobs_are_searched_only_with_several_gpus():
    c = campaign()
    assert hardware.multi_gpu_space(c, n_gpus=1) == c
    assert hardware.multi_gpu_space(c) == c  # this machine: CPU only
    two = hardware.multi_gpu_space(c, n_gpus=2)
    check_space(two, BENCH_SUPPORTED)
    dists = distributions(two)
    assert dists["split_mode"] == CategoricalDistribution(["layer", "row"])
    assert dists["tensor_split"] == CategoricalDistribution(["1/1", "2/1", "1/2"])
    assert hardware.split_choices(3) == ["1/1/1", "2/1/1", "1/1/2"]
    # a campaign that sets a knob keeps its own choice
    assert hardware.multi_gpu_space(campaign(split_mode="row"), n_gpus=2).space["split_mode"] == "row"


def test_split_knobs_become_flags():
    two = hardware.multi_gpu_space(campaign(), n_gpus=2)
    config = to_config(two, {"n_cpu_moe": 8, "split_mode": "row", "tensor_split": "2/1"}, {"/m/a.gguf": "/m/a.gguf"})
    argv = bench_args_for(config, None)
    assert argv[argv.index("-sm") + 1] == "row" and argv[argv.index("-ts") + 1] == "2/1"
    served = server_args(config)
    assert served[served.index("-ts") + 1] == "2,1"  # llama-server separates with commas


@pytest.mark.parametrize("space, needle", [
    ({"split_mode": ["layer", "diagonal"]}, "space.split_mode: 'diagonal' is not valid"),
    ({"tensor_split": ["1,1"]}, "space.tensor_split: '1,1' is not valid"),
    ({"main_gpu": -1}, "space.main_gpu: -1 is not valid"),
])
def test_bad_split_values_name_the_key(space, needle):
    with pytest.raises(UserError, match=needle):
        check_space(campaign(**space), BENCH_SUPPORTED)
