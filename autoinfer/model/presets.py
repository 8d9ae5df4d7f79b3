"""Shapes of the synthetic qwen35moe models: a tiny one for tests, a small one for memory models, the real 35B-A3B.

Every matrix row length (hidden, expert FFN, attention output, GDN value width) is a multiple of 256 so that every
K- and IQ-quant block fits without per-tensor fallbacks: a tiny Q4_K model then runs the same kernels as the real one.
"""

from __future__ import annotations

from autoinfer.errors import UserError
from autoinfer.model.arch import DEFAULT_ROPE_THETA, Architecture, attention_layers


def _preset(*, n_layers: int, head_dim: int, **numbers: int | tuple[int, ...]) -> Architecture:
    """A preset: every GDN/attention split by llama.cpp's default interval, RMS eps and RoPE base of the real model."""
    return Architecture(n_layers=n_layers, head_dim=head_dim, value_dim=head_dim, rope_theta=DEFAULT_ROPE_THETA,
                        rms_eps=1.0e-6, attention_layers=attention_layers(n_layers), **numbers)


PRESETS: dict[str, Architecture] = {
    # A few MB: one attention layer (i=3), 8 experts top-2; loads in well under a second.
    "tiny": _preset(hidden=256, n_layers=4, n_experts=8, n_experts_used=2, expert_ffn=256, shared_ffn=256,
                    n_heads=2, n_kv_heads=1, head_dim=128, rope_dims=32, rope_sections=(6, 5, 5, 0),
                    gdn_k_heads=2, gdn_v_heads=4, gdn_head_dim=64, conv_kernel=4, vocab=1024, context_length=4096),
    # Tens of MB: two attention layers, 32 experts top-4; experts dominate the bytes as in the real model.
    "small": _preset(hidden=512, n_layers=8, n_experts=32, n_experts_used=4, expert_ffn=256, shared_ffn=256,
                     n_heads=4, n_kv_heads=1, head_dim=128, rope_dims=32, rope_sections=(6, 5, 5, 0),
                     gdn_k_heads=4, gdn_v_heads=8, gdn_head_dim=64, conv_kernel=4, vocab=8192, context_length=32768),
    # Qwen3.5/3.6-35B-A3B text model: 34.66 B parameters, ~19.6 GB at Q4_K.
    "35b-a3b": _preset(hidden=2048, n_layers=40, n_experts=256, n_experts_used=8, expert_ffn=512, shared_ffn=512,
                       n_heads=16, n_kv_heads=2, head_dim=256, rope_dims=64, rope_sections=(11, 11, 10, 0),
                       gdn_k_heads=16, gdn_v_heads=32, gdn_head_dim=128, conv_kernel=4, vocab=248320,
                       context_length=262144),
}


def get_preset(name: str) -> Architecture:
    """The preset called `name`; a UserError that lists the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
