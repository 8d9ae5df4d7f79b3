"""The engine with its matrices kept in GGUF blocks (weights: gguf, Triton kernels under TRITON_INTERPRET=1) against
the same model decoded to fp32 at load: same logits within fp32 rounding, for every kernel variant combination."""

from __future__ import annotations

import pytest
import torch

from autoinfer.errors import UserError
from autoinfer.model.synth import cached_model
from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.loader import load
from autoinfer.refengine.ops.quant.qweight import QuantWeight
from autoinfer.refengine.options import EngineOptions

BOUND = 1e-4  # relative to max|logit|: fp32 activations, only the summation order differs


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module", params=["Q4_K"])  # the kernels of each block type: test_quant_kernels.py
def model(request):
    return cached_model("tiny", request.param)


def logits(model, prompt, **knobs) -> tuple[torch.Tensor, torch.Tensor, ReferenceEngine]:
    engine = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    first, state = engine.prefill(prompt)
    return first, engine.decode(int(first[-1].argmax()), state), engine


def test_matrices_stay_in_their_blocks(model):
    _, weights = load(model, keep_quant=True)
    moe = weights.layers[0].moe
    assert isinstance(moe.gate, QuantWeight) and moe.gate.raw.dtype == torch.uint8
    assert isinstance(weights.lm_head, QuantWeight) and isinstance(weights.embed, QuantWeight)
    assert moe.router.dtype == torch.float32  # routers, norms and conv stay dense fp32


@pytest.mark.parametrize("gdn, moe, norm", [("fused_recurrent", "fused", "triton"), ("triton_chunk", "fused", "torch"),
                                            ("chunk", "grouped", "torch")])
def test_gguf_weights_give_the_dense_engines_logits(model, gdn, moe, norm):
    prompt = list(range(3, 15))  # 12 tokens: more than GEMV_MAX_ROWS, so prefill takes the GEMM path
    ref_pp, ref_tg, _ = logits(model, prompt)
    pp, tg, engine = logits(model, prompt, weights="gguf", gdn=gdn, moe=moe, norm=norm)
    assert rel(pp, ref_pp) <= BOUND and rel(tg, ref_tg) <= BOUND
    dense_bytes = ReferenceEngine.from_gguf(model, EngineOptions()).experts.device_bytes()
    assert engine.experts.device_bytes() < dense_bytes / 3  # ≤ 8.5 bits per weight instead of 32


def test_expert_cache_holds_gguf_blocks(model):
    prompt = list(range(5, 17))
    ref_pp, ref_tg, _ = logits(model, prompt)
    pp, tg, engine = logits(model, prompt, weights="gguf", gdn="fused_recurrent", moe="fused", expert_slots=5)
    assert rel(pp, ref_pp) <= BOUND and rel(tg, ref_tg) <= BOUND
    assert engine.experts.stats.misses > 0 and isinstance(engine.experts.pool.gate, QuantWeight)



def test_misses_on_the_host_decode_only_the_missed_experts_blocks(model):
    """misses: cpu with experts in GGUF blocks: each missed expert's blocks decoded on the host (once: the LRU keeps
    them), the logits those of the dense engine with every expert resident."""
    prompt = list(range(5, 17))
    knobs = dict(weights="gguf", gdn="fused_recurrent", moe="fused", expert_slots=5, misses="cpu")
    engine = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    resident = ReferenceEngine.from_gguf(model, EngineOptions())
    (a, sa), (b, sb) = resident.prefill(prompt), engine.prefill(prompt)
    for _ in range(4):
        assert rel(b, a) <= BOUND
        token = int(a[-1].argmax())
        a, b = resident.decode(token, sa), engine.decode(token, sb)
    assert rel(b, a) <= BOUND
    stats, host = engine.experts.stats, engine.experts.on_host
    assert stats.cpu_computed >= 4 * 3  # each step: ≥ 3 of its 8 choices (4 layers × 2) are not in the 5 slots
    assert stats.bytes_fetched == (stats.misses - stats.cpu_computed) * engine.experts.expert_bytes
    assert 0 < stats.cpu_decoded == len(host.decoded) <= stats.cpu_computed  # every decoded expert is still kept
    assert all(m.dtype == torch.float32 for mats in host.decoded.values() for m in mats)


def test_host_experts_decode_an_expert_once_while_it_stays_in_their_lru(model):
    from autoinfer.refengine.cache.host import HostExperts
    from autoinfer.refengine.ops.moe import ExpertBank
    from autoinfer.refengine.ops.quant.kernels import dequantize

    _, weights = load(model, keep_quant=True)
    host = HostExperts([ExpertBank(layer.moe.gate, layer.moe.up, layer.moe.down) for layer in weights.layers])
    host.capacity = 2
    assert [host.matrices(1, e)[1] for e in (3, 3, 4, 3, 5, 4)] == [True, False, True, False, True, True]
    assert list(host.decoded) == [(1, 5), (1, 4)]  # 3 was the least recently used when 5 came
    gate, up, down = host.matrices(1, 4)[0]
    bank = weights.layers[1].moe
    assert torch.equal(gate, dequantize(bank.gate[4])) and torch.equal(down, dequantize(bank.down[4]))

def test_budget_plan_counts_experts_in_their_blocks(model):
    """With weights: gguf an expert costs its block bytes, so the same budget holds ~7× more experts than fp32."""
    from autoinfer.refengine.budget import DevicePlan

    quant, dense = (DevicePlan.from_gguf(model, EngineOptions(weights=w)) for w in ("gguf", "dense"))
    assert quant.expert_bytes == 3 * 256 * 256 // 256 * 144  # Q4_K: 144 bytes per 256 values
    assert dense.expert_bytes == 3 * 256 * 256 * 4
    engine = ReferenceEngine.from_gguf(model, EngineOptions(weights="gguf", gdn="fused_recurrent", moe="fused"))
    assert engine.plan == quant


def test_fused_moe_needs_gguf_weights():
    with pytest.raises(UserError, match="weights: gguf"):
        EngineOptions(moe="fused").check()
    with pytest.raises(UserError, match="weights 'q4'"):
        EngineOptions(weights="q4").check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("prefetch", [0, 2])
def test_streamed_experts_give_the_resident_logits_on_the_gpu(model, prefetch):
    """Experts copied from pinned host memory into 5 device slots (prefetches on their own stream) compute what
    resident experts do, over a prefill and decode steps."""
    knobs = dict(device="cuda", weights="gguf", gdn="triton_chunk", moe="fused", norm="triton")
    resident = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    streamed = ReferenceEngine.from_gguf(model, EngineOptions(**knobs, expert_slots=5, prefetch=prefetch))
    prompt = list(range(5, 40))
    a, sa = resident.prefill(prompt)
    b, sb = streamed.prefill(prompt)
    for _ in range(8):
        assert rel(b, a) <= BOUND
        token = int(a[-1].argmax())
        a, b = resident.decode(token, sa), streamed.decode(token, sb)
    stats = streamed.experts.stats
    assert stats.misses > 0 and (stats.prefetched > 0) == (prefetch > 0)


def test_step_expert_cache_decodes_like_resident_experts(model):
    """The device-side lookup that a decode step recorded as a CUDA graph uses (run eagerly here, under the
    interpreter): misses read from host memory inside the step into spare slots, recorded by the host after it."""
    from autoinfer.refengine.cache.experts import StepExpertCache

    knobs = dict(weights="gguf", gdn="fused_recurrent", moe="fused", norm="triton")
    resident = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    cached = ReferenceEngine.from_gguf(model, EngineOptions(**knobs, expert_slots=5))  # 8 experts × 4 layers exist
    cache = StepExpertCache(cached.experts.host, 24, torch.device("cpu"), "lru", cached.cfg.n_experts_used)
    cached.model.experts = cached.experts = cache
    a, sa = resident.prefill(list(range(5, 17)))
    b, sb = cached.prefill(list(range(5, 17)))
    assert rel(b, a) <= BOUND
    for _ in range(8):  # a step's hits must not be evicted for the next spares (seen from the second step on)
        token = int(a[-1].argmax())
        cache.before_step()
        a, b = resident.decode(token, sa), cached.decode(token, sb)
        cache.after_step()
        assert rel(b, a) <= BOUND
    assert cache.stats.misses > 0 and cache.stats.hits > 0
    assert cache.table.tolist() == cache.mirror.tolist() or cache.dirty
    cached_slots = [s for s in cache.mirror.flatten().tolist() if s >= 0]
    assert sorted(cached_slots) == sorted(cache.where.values())
    spares = [s for layer in cache.spares for s in layer]
    assert len(spares) == 4 * cached.cfg.n_experts_used and not set(spares) & set(cached_slots)
    assert cache.spare.tolist() == cache.spares or cache.dirty
