"""Bytes on each side for llama.cpp placements, checked against the tiny model's own tensor list."""

from __future__ import annotations

import pytest

from autoinfer.errors import UserError
from autoinfer.model.gguf_info import read_info
from autoinfer.model.placement import placement_bytes


@pytest.fixture(scope="module")
def info(tiny_model):
    return read_info(tiny_model)


def _bytes(info, pred) -> int:
    return sum(t.n_bytes for t in info.tensors if pred(t))


def test_cpu_only_and_all_layers(info):
    total = sum(t.n_bytes for t in info.tensors)
    none = placement_bytes(info, 0)
    assert none.gpu_bytes == 0 and none.cpu_bytes == total
    full = placement_bytes(info, 99)
    assert full.cpu_bytes == _bytes(info, lambda t: t.name.startswith("token_embd."))  # input layer stays on CPU
    assert full.gpu_bytes + full.cpu_bytes == total
    assert placement_bytes(info, 99, gpu=False).cpu_bytes == total


def test_output_layer_is_offloaded_first(info):
    one = placement_bytes(info, 1)
    assert one.gpu_bytes == _bytes(info, lambda t: t.layer is None and not t.name.startswith("token_embd."))
    two = placement_bytes(info, 2)
    last = info.n_layers - 1
    assert two.gpu_bytes - one.gpu_bytes == _bytes(info, lambda t: t.layer == last)


def test_ncmoe_moves_the_experts_of_the_first_layers(info):
    full = placement_bytes(info, 99)
    moved = placement_bytes(info, 99, n_cpu_moe=2)
    experts = _bytes(info, lambda t: t.group == "routed_experts" and t.layer in (0, 1))
    assert experts > 0 and moved.cpu_bytes - full.cpu_bytes == experts
    share = info.n_experts_used / info.n_experts
    assert moved.active_cpu_bytes == pytest.approx(experts * share)


def test_first_matching_override_wins(info):
    # A user pattern keeping layer 0's experts on the device comes before -ncmoe's CPU pattern for layer 0.
    kept = placement_bytes(info, 99, n_cpu_moe=1, override_tensors=[r"blk\.0\.ffn_.*_exps=CUDA0"])
    assert kept.cpu_bytes == placement_bytes(info, 99).cpu_bytes
    moved = placement_bytes(info, 99, override_tensors=[r"blk\.[0-9]+\.ffn_(up|down|gate)_exps=CPU"])
    assert moved.cpu_bytes - placement_bytes(info, 99).cpu_bytes == _bytes(info, lambda t: t.group == "routed_experts")


def test_bad_override_is_a_user_error(info):
    with pytest.raises(UserError, match="regex=BUFFER"):
        placement_bytes(info, 99, override_tensors=["blk.0"])
    with pytest.raises(UserError, match="bad regex"):
        placement_bytes(info, 99, override_tensors=["blk.(0=CPU"])
