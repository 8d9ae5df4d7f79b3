"""A Hugging Face `Qwen3_5MoeForCausalLM` with random weights, and the exact same weights as a qwen35moe GGUF.

This is the independent reference for the engine's correctness tests: the network code is transformers', the
weight conversion follows llama.cpp's convert_hf_to_gguf (Qwen3_5MoeTextModel): norm weights become 1 + w (except
the GDN output norm), A_log becomes −exp(A_log), the conv kernel loses its middle axis, gate_up_proj is split, and
GDN value heads are reordered from grouped to tiled order. Needs transformers (the `dev` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from autoinfer.model.arch import RUNNABLE_ARCH

TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts_per_tok=2, num_experts=8, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False)
ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}


def tiny_hf_model(seed: int = 0, **overrides: Any):
    """A tiny Qwen3_5MoeForCausalLM in fp32 with weights scaled so activations and logit gaps are O(1)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(**{**TINY, **overrides}, rope_parameters=dict(ROPE))
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-2.0, 1.0, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim == 1:  # norm weights: zero-centred except the gated GDN norm
                centre = 1.0 if name.endswith("linear_attn.norm.weight") else 0.0
                p.copy_(centre + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        model.lm_head.weight.mul_(4.0)  # spread the logits so greedy choices are not near-ties
    return model


def _reorder_v(t: torch.Tensor, dim: int, n_k: int, per_k: int, head: int) -> torch.Tensor:
    """Grouped [K0v0 K0v1 … K1v0 …] → tiled [K0v0 K1v0 … K0v1 K1v1 …] along dim (llama.cpp's order)."""
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], n_k, per_k, head, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """HF state dict → GGUF tensor name → numpy array (fp32, numpy order = torch Linear layout)."""
    cfg = model.config
    n_k, n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    per_k, dk, dv = n_v // n_k, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": 1 + sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i, kind in enumerate(cfg.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = 1 + sd[p + "input_layernorm.weight"]
        out[b + "post_attention_norm.weight"] = 1 + sd[p + "post_attention_layernorm.weight"]
        if kind == "full_attention":
            a = p + "self_attn."
            out.update({b + "attn_q.weight": sd[a + "q_proj.weight"], b + "attn_k.weight": sd[a + "k_proj.weight"],
                        b + "attn_v.weight": sd[a + "v_proj.weight"], b + "attn_output.weight": sd[a + "o_proj.weight"],
                        b + "attn_q_norm.weight": 1 + sd[a + "q_norm.weight"],
                        b + "attn_k_norm.weight": 1 + sd[a + "k_norm.weight"]})
        else:
            a = p + "linear_attn."
            qkv = sd[a + "in_proj_qkv.weight"]
            qk = 2 * n_k * dk
            qkv = torch.cat([qkv[:qk], _reorder_v(qkv[qk:], 0, n_k, per_k, dv)])
            conv = sd[a + "conv1d.weight"].squeeze(1)
            conv = torch.cat([conv[:qk], _reorder_v(conv[qk:], 0, n_k, per_k, dv)])
            out.update({
                b + "attn_qkv.weight": qkv,
                b + "attn_gate.weight": _reorder_v(sd[a + "in_proj_z.weight"], 0, n_k, per_k, dv),
                b + "ssm_beta.weight": _reorder_v(sd[a + "in_proj_b.weight"], 0, n_k, per_k, 1),
                b + "ssm_alpha.weight": _reorder_v(sd[a + "in_proj_a.weight"], 0, n_k, per_k, 1),
                b + "ssm_conv1d.weight": conv,
                b + "ssm_dt.bias": _reorder_v(sd[a + "dt_bias"][:, None], 0, n_k, per_k, 1)[:, 0],
                b + "ssm_a": _reorder_v(-sd[a + "A_log"].exp()[:, None], 0, n_k, per_k, 1)[:, 0],
                b + "ssm_norm.weight": sd[a + "norm.weight"],
                b + "ssm_out.weight": _reorder_v(sd[a + "out_proj.weight"], 1, n_k, per_k, dv)})
        m = p + "mlp."
        gate_up = sd[m + "experts.gate_up_proj"]  # [n, 2F, E]
        F_ = gate_up.shape[1] // 2
        out.update({b + "ffn_gate_inp.weight": sd[m + "gate.weight"],
                    b + "ffn_gate_exps.weight": gate_up[:, :F_], b + "ffn_up_exps.weight": gate_up[:, F_:],
                    b + "ffn_down_exps.weight": sd[m + "experts.down_proj"],
                    b + "ffn_gate_inp_shexp.weight": sd[m + "shared_expert_gate.weight"][0],
                    b + "ffn_gate_shexp.weight": sd[m + "shared_expert.gate_proj.weight"],
                    b + "ffn_up_shexp.weight": sd[m + "shared_expert.up_proj.weight"],
                    b + "ffn_down_shexp.weight": sd[m + "shared_expert.down_proj.weight"]})
    return {k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def _byte_tokens(vocab: int) -> tuple[list[str], list[int]]:
    """A minimal GPT-2 byte-level vocabulary so llama-server loads: the 128 ASCII byte tokens, one merge, ASCII
    fillers and an end token. Every token decodes to complete UTF-8, so the server reports each generated token
    separately (it holds back tokens that end inside a multi-byte character)."""
    printable = set(range(ord("!"), ord("~") + 1))
    shifted = iter(range(256, 512))
    tokens = [chr(b) if b in printable else chr(next(shifted)) for b in range(128)] + ["Ġt"]
    tokens += [f"<|filler{i}|>" for i in range(vocab - len(tokens) - 1)] + ["<|endoftext|>"]
    types = [1] * (vocab - 1) + [3]
    return tokens, types


def write_gguf(model, path: Path, dtype: str = "F32", tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write the HF model's weights as a qwen35moe GGUF; dtype F32 or F16 for the 2-D weight matrices.
    `tensors` replaces gguf_tensors(model) (tests write deliberately broken files with it)."""
    import gguf

    cfg = model.config
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), RUNNABLE_ARCH)
    w.add_name("hf-reference-tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    w.add_rope_dimension_sections([*cfg.rope_parameters["mrope_section"], 0])
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_full_attention_interval(4)
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    w.add_vocab_size(cfg.vocab_size)
    tokens, types = _byte_tokens(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(cfg.vocab_size - 1)
    w.add_bos_token_id(cfg.vocab_size - 1)
    w.add_add_bos_token(False)
    for name, array in (gguf_tensors(model) if tensors is None else tensors).items():
        small = array.ndim == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight"))
        w.add_tensor(name, array if small or dtype == "F32" else array.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
