"""The decode step recorded as a CUDA graph (graphs: on): the static state it needs computes what a dynamic one
does (checked here on the CPU), graphs are refused where they cannot run, and on a GPU the replayed decode gives
the eager decode's logits and tokens."""

from __future__ import annotations

import pytest
import torch

from autoinfer.errors import UserError
from autoinfer.refengine import model as model_module
from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.options import EngineOptions


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def loaded(hf_gguf):
    from autoinfer.refengine.loader import load

    return load(hf_gguf, "fp32")


def test_static_state_gives_the_dynamic_states_logits(loaded, prompt):
    """A static state (fixed capacity, attention over all of it under the mask, in-place updates) is what the graph
    records; eagerly it must compute exactly what the growing state does."""
    model = ReferenceEngine(*loaded, EngineOptions()).model
    dynamic, static = model.new_state(capacity=8), model.new_state(capacity=64, static=True)
    a, b = model.forward(prompt[:20], dynamic), model.forward(prompt[:20], static)
    assert rel(b, a) <= 1e-6
    for _ in range(6):
        token = int(a.argmax())
        a, b = model.forward([token], dynamic), model.forward([token], static)
        assert rel(b, a) <= 1e-6
    assert static.layers[3].k.shape[1] == 64 and static.position == dynamic.position == 26
    with pytest.raises(UserError, match="max_context"):
        model.forward(prompt[:40], static)  # 26 + 40 > 64


def test_a_prompt_chunk_reads_only_the_filled_positions_in_bounded_blocks(loaded, prompt, monkeypatch):
    """A static state sized for a serving context (max_context 32768) once made a prompt chunk's scores span every
    position it could hold (with the recording's copy of the state, peaks 4.7 GiB above the device plan on an H100).
    A chunk now reads the positions filled so far, its scores in blocks of query rows of at most SCORES_BLOCK_BYTES,
    and computes the same logits."""
    model = ReferenceEngine(*loaded, EngineOptions()).model
    whole = model.forward(prompt[:20], model.new_state(capacity=8))
    seen: list[tuple[int, int]] = []

    def spy(q, keys, values, positions):
        seen.append((q.shape[1], keys.shape[1]))
        return attend(q, keys, values, positions)

    attend = model_module.attend
    monkeypatch.setattr(model_module, "attend", spy)
    cfg = model.cfg
    monkeypatch.setattr(model_module, "SCORES_BLOCK_BYTES", cfg.n_kv_heads * 20 * 4 * 7)  # 7 rows of 20 keys a block
    static = model.new_state(capacity=4096, static=True)
    blocked = model.forward(prompt[:20], static)
    rows = cfg.n_heads // cfg.n_kv_heads * 20
    assert seen and {keys for _, keys in seen} == {20} and max(r for r, _ in seen) == 7
    assert sum(r for r, _ in seen) == rows * sum(1 for layer in static.layers if hasattr(layer, "k"))
    assert rel(blocked, whole) <= 1e-6
    seen.clear()
    model.forward([int(blocked.argmax())], static)  # one token reads the whole buffer under the mask (graph shapes)
    assert {keys for _, keys in seen} == {4096}


def test_without_graphs_a_state_holds_max_context_positions_from_the_start(loaded, prompt):
    """The device plan counts the state at max_context (the serving context a campaign sets) and the measured peak
    decides a trial: a dynamic state that grew only as far as the measurement's prompt left the context out of it."""
    engine = ReferenceEngine(*loaded, EngineOptions(max_context=300))
    state = engine.new_state()
    caches = [layer for layer in state.layers if hasattr(layer, "k")]
    assert caches and all(c.k.shape[1] == 300 and not c.static for c in caches)
    logits, state = engine.prefill(prompt[:20], state)
    assert rel(logits, engine.model.forward(prompt[:20], engine.model.new_state(capacity=8))) <= 1e-6
    assert all(c.k.shape[1] == 300 for c in caches) and state.position == 20


def test_reset_and_load_keep_the_static_buffers(loaded, prompt):
    model = ReferenceEngine(*loaded, EngineOptions()).model
    static = model.new_state(capacity=64, static=True)
    buffers = [t.data_ptr() for layer in static.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    model.forward(prompt[:10], static)
    snapshot = static.clone()
    kv = [layer for layer in snapshot.layers if hasattr(layer, "k")]
    assert kv and all(c.k.shape[1] == 10 and not c.static for c in kv)  # the filled positions, not 64 of capacity
    static.reset_()
    assert static.position == 0 and not static.tokens
    static.load_(snapshot)
    assert static.position == 10 and static.tokens == prompt[:10]
    after = [t.data_ptr() for layer in static.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert after == buffers
    assert torch.equal(model.forward(prompt[10:12], static), model.forward(prompt[10:12], snapshot))


@pytest.mark.parametrize("knobs, words", [
    ({"device": "cpu"}, "needs device: cuda"),
    ({"device": "cuda"}, "cuda"),
])
def test_graphs_are_refused_where_they_cannot_run(knobs, words):
    if knobs["device"] == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match=words):
        EngineOptions(graphs=True, weights="gguf", moe="fused", gdn="fused_recurrent", **knobs).check()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("knobs, words", [
    ({"expert_slots": 4, "prefetch": 1}, "prefetch: 0"),
    ({"moe": "grouped", "weights": "dense"}, "moe variant"),
    ({"gdn": "chunk"}, "gdn variant"),
])
def test_graphs_refuse_what_a_graph_cannot_record(knobs, words):
    options = {"device": "cuda", "graphs": True, "weights": "gguf", "moe": "fused", "gdn": "fused_recurrent", **knobs}
    with pytest.raises(UserError, match=words):
        EngineOptions(**options).check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype, bound", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_graph_decode_matches_eager_decode(dtype, bound):
    from autoinfer.model.synth import cached_model

    model = cached_model("tiny", "Q4_K")
    knobs = dict(device="cuda", dtype=dtype, weights="gguf", moe="fused", gdn="triton_chunk", norm="triton",
                 max_context=64)
    eager = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    graphed = ReferenceEngine.from_gguf(model, EngineOptions(**knobs, graphs=True))
    prompt = list(range(3, 40))
    for _ in range(2):  # the second sequence replays the graph recorded during the first
        a, sa = eager.prefill(prompt)
        b, sb = graphed.prefill(prompt)
        tokens_a, tokens_b = [], []
        for _ in range(12):
            tokens_a.append(int(a[-1].argmax()))
            tokens_b.append(int(b[-1].argmax()))
            assert rel(b, a) <= bound
            a, b = eager.decode(tokens_a[-1], sa), graphed.decode(tokens_a[-1], sb)
        assert tokens_a == tokens_b
    assert graphed.graph is not None and sb is graphed.static


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graph_decode_through_the_step_expert_cache_matches_resident_experts():
    """Experts looked up on the device inside the graph, misses read from pinned host memory into spare slots,
    recorded between steps: the same logits as with every expert resident."""
    from autoinfer.model.synth import cached_model

    model = cached_model("tiny", "Q4_K")
    knobs = dict(device="cuda", dtype="fp32", weights="gguf", moe="fused", gdn="triton_chunk", norm="triton",
                 max_context=64, graphs=True)
    resident = ReferenceEngine.from_gguf(model, EngineOptions(**knobs))
    cached = ReferenceEngine.from_gguf(model, EngineOptions(**knobs, expert_slots=24))  # 8 experts × 4 layers exist
    assert type(cached.experts).__name__ == "StepExpertCache"
    prompt = list(range(3, 40))
    for _ in range(2):
        a, sa = resident.prefill(prompt)
        b, sb = cached.prefill(prompt)
        for _ in range(12):
            assert rel(b, a) <= 1e-5
            token = int(a[-1].argmax())
            a, b = resident.decode(token, sa), cached.decode(token, sb)
    stats = cached.experts.stats
    assert stats.misses > 0 and stats.hits > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_worker_records_the_graph_after_a_prompt_that_fills_the_static_state():
    """The sweep's worker sizes the static state to the prompt and one token; the graph is recorded at the warm-up's
    first decode step, when that state is full (a campaign's every graphs-on trial once failed there)."""
    from autoinfer.model.synth import cached_model
    from autoinfer.refengine import worker

    args = worker.parse_args(["--model", str(cached_model("tiny", "Q4_K")), "--n-prompt", "16", "--n-gen", "4",
                              "--repetitions", "2", "--device", "cuda", "--weights", "gguf", "--moe", "fused",
                              "--gdn", "triton_chunk", "--graphs", "on", "--expert-slots", "24"])
    result = worker.measure(args)
    assert len(result["tg_samples"]) == 2 and min(result["tg_samples"]) > 0 and result["graphs"]
