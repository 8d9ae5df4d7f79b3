"""GDN state snapshots give bit-identical logits to a cold run; the expert cache computes what resident experts do."""

from __future__ import annotations

import pytest
import torch

from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.options import EngineOptions


@pytest.fixture(scope="module")
def loaded(hf_gguf):
    from autoinfer.refengine.loader import load

    return load(hf_gguf, "fp32")


def engine(loaded, **options) -> ReferenceEngine:
    return ReferenceEngine(*loaded, EngineOptions(**options))


def test_shared_prefix_resumes_from_snapshot_with_identical_logits(loaded, prompt):
    first, second = prompt[:150], prompt[:131] + prompt[-19:][::-1]  # share 131 tokens → resume at 128
    warm = engine(loaded, snapshots=True, prefill_chunk=64)
    warm.prefill(first)
    assert warm.snapshots.stats.misses == 1 and warm.snapshots.stats.stored == 3  # at 64, 128 and 150
    warm_logits, warm_state = warm.prefill(second)
    stats = warm.snapshots.stats
    assert stats.hits == 1 and stats.tokens_reused == 128 and stats.time_saved_s > 0

    cold = engine(loaded, prefill_chunk=64)
    cold_logits, cold_state = cold.prefill(second)
    assert torch.equal(warm_logits, cold_logits)
    for _ in range(3):  # decoding on from the resumed state stays identical too
        token = int(cold_logits.argmax())
        warm_logits, cold_logits = warm.decode(token, warm_state), cold.decode(token, cold_state)
        assert torch.equal(warm_logits, cold_logits)


def test_repeated_prompt_is_served_from_its_end_snapshot(loaded, prompt):
    warm = engine(loaded, snapshots=True, prefill_chunk=64)
    cold_logits, _ = warm.prefill(prompt[:100])
    again, state = warm.prefill(prompt[:100])
    assert torch.equal(again, cold_logits)
    assert warm.snapshots.stats.hits == 1 and warm.snapshots.stats.tokens_reused == 100
    assert state.position == 100


def test_unrelated_prompt_misses(loaded, prompt):
    warm = engine(loaded, snapshots=True, prefill_chunk=64)
    warm.prefill(prompt[:100])
    warm.prefill(prompt[1:101])
    assert warm.snapshots.stats.hits == 0 and warm.snapshots.stats.misses == 2


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_expert_cache_with_few_slots_matches_resident_experts(loaded, prompt, policy, prefetch):
    resident = engine(loaded)
    cached = engine(loaded, expert_slots=5, cache_policy=policy, prefetch=prefetch)  # 8 experts × 4 layers exist
    ref_logits, ref_state = resident.prefill(prompt[:70])
    logits, state = cached.prefill(prompt[:70])  # a 70-token prefill needs all 8 experts: runs in rounds
    assert torch.allclose(logits, ref_logits, rtol=0, atol=1e-5 * float(ref_logits.abs().max()))
    for _ in range(8):
        token = int(ref_logits.argmax())
        ref_logits, logits = resident.decode(token, ref_state), cached.decode(token, state)
        assert torch.allclose(logits, ref_logits, rtol=0, atol=1e-5 * float(ref_logits.abs().max()))
    stats = cached.experts.stats
    assert stats.misses > 0 and stats.hits + stats.misses > 0
    assert 0.0 <= stats.hit_rate < 1.0
    assert stats.bytes_fetched == stats.misses * 3 * 64 * 32 * 4 + stats.prefetched * 3 * 64 * 32 * 4
    if prefetch:
        assert stats.prefetched > 0
    else:
        assert stats.prefetched == 0 and stats.prefetch_used == 0


def test_enough_slots_means_no_cache(loaded):
    assert type(engine(loaded, expert_slots=32).experts).__name__ == "ResidentExperts"
    assert type(engine(loaded, expert_slots=31).experts).__name__ == "ExpertCache"


def test_device_budget_becomes_expert_slots(loaded, hf_gguf):
    from autoinfer.errors import UserError
    from autoinfer.refengine.budget import DevicePlan

    planned = DevicePlan.from_gguf(hf_gguf, EngineOptions())
    assert planned == engine(loaded).plan  # the plan from the file's header is what the engine placed
    each = planned.expert_bytes
    fixed = planned.other_bytes + planned.state_bytes + planned.reserve_bytes
    assert planned.slots((fixed + planned.n_experts * each) / 2**20) == 0
    assert planned.slots((fixed + 10.5 * each) / 2**20) == 10
    with pytest.raises(UserError, match="needs ≥ 2"):
        planned.slots((fixed + each) / 2**20)
    budgeted = engine(loaded, budget_mib=(fixed + 10.5 * each) / 2**20)
    assert budgeted.experts.slots == 10 and budgeted.stats()["device_plan"]["expert_slots"] == 10


def test_misses_computed_on_the_host_match_copied_and_resident_experts(loaded, prompt):
    """misses: cpu computes what copying the misses computes, and copies nothing for the misses it computes."""
    resident, copied = engine(loaded), engine(loaded, expert_slots=5)
    on_host = engine(loaded, expert_slots=5, misses="cpu")
    (ref, ref_state), (a, a_state), (b, b_state) = (e.prefill(prompt[:70]) for e in (resident, copied, on_host))
    for _ in range(8):
        bound = 1e-5 * float(ref.abs().max())
        assert torch.allclose(a, ref, rtol=0, atol=bound) and torch.allclose(b, ref, rtol=0, atol=bound)
        assert int(b.argmax()) == int(ref.argmax())
        token = int(ref.argmax())
        ref, a, b = resident.decode(token, ref_state), copied.decode(token, a_state), on_host.decode(token, b_state)
    stats = on_host.experts.stats
    assert stats.cpu_computed >= 8 * 3  # each step: ≥ 3 of its 8 choices (4 layers × 2) are not in the 5 slots
    assert stats.cpu_decoded == 0  # dense host experts need no decoding
    assert stats.bytes_fetched == (stats.misses - stats.cpu_computed) * on_host.experts.expert_bytes
    assert stats.bytes_fetched < copied.experts.stats.bytes_fetched
    assert on_host.stats()["experts"]["cpu_computed"] == stats.cpu_computed  # what the worker's JSON reports


def test_a_decode_step_computes_its_misses_on_the_host_and_leaves_the_slots_alone(loaded):
    """One token through an expert cache whose slots hold neither of its experts: both computed on the host, their
    weighted sum what the loop reference gives over all experts."""
    from autoinfer.refengine.cache.experts import ExpertCache
    from autoinfer.refengine.ops.moe import ExpertBank
    from autoinfer.refengine.ops.moe.loop import loop_experts

    _, weights = loaded
    host = [ExpertBank(layer.moe.gate, layer.moe.up, layer.moe.down) for layer in weights.layers]
    cache = ExpertCache(host, 2, torch.device("cpu"), misses="cpu")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, host[0].gate.shape[-1], generator=gen)
    token, expert, weight = torch.zeros(2, dtype=torch.long), torch.tensor([6, 1]), torch.tensor([0.7, 0.3])
    y = cache.run(2, x, token, expert, weight, loop_experts)
    assert torch.allclose(y, loop_experts(x, token, expert, weight, host[2]), rtol=1e-6, atol=1e-6)
    assert float(y.abs().max()) > 0
    assert (cache.stats.misses, cache.stats.cpu_computed, cache.stats.bytes_fetched) == (2, 2, 0)
    assert not cache.where and sorted(cache.free) == [0, 1]
