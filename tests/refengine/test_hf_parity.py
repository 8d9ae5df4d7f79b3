"""The engine against transformers' Qwen3_5MoeForCausalLM on identical weights (written to GGUF, loaded back)."""

from __future__ import annotations

import pytest
import torch

from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.options import EngineOptions

# fp32 both sides; chunked vs recurrent GDN and different summation orders leave ~1e-6.
FP32_BOUND = 1e-4


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours − ref| / max |ref|: logits are O(1), so this is the elementwise error at the logits' scale."""
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("gdn,moe", [("chunk", "grouped"), ("naive", "loop")])
def test_prefill_and_20_decode_steps_match_transformers(hf_model, hf_gguf, prompt, gdn, moe):
    from transformers import DynamicCache

    engine = ReferenceEngine.from_gguf(hf_gguf, EngineOptions(gdn=gdn, moe=moe, prefill_chunk=512))
    with torch.no_grad():
        cache = DynamicCache(config=hf_model.config)
        ref = hf_model(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0]
    state = engine.new_state()
    ours = engine.model.forward(prompt, state, all_logits=True)
    assert ours.shape == ref.shape == (len(prompt), hf_model.config.vocab_size)
    assert rel_err(ours, ref) <= FP32_BOUND

    token = int(ref[-1].argmax())
    for _ in range(20):
        with torch.no_grad():
            ref_step = hf_model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
        ours_step = engine.decode(token, state)[-1]
        assert rel_err(ours_step, ref_step) <= FP32_BOUND
        assert int(ours_step.argmax()) == int(ref_step.argmax())
        token = int(ref_step.argmax())


def test_greedy_generation_matches_transformers(hf_model, hf_gguf, prompt):
    engine = ReferenceEngine.from_gguf(hf_gguf, EngineOptions())
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([prompt[:40]]), max_new_tokens=12, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, 40:].tolist()
    assert engine.generate(prompt[:40], 12) == ref
