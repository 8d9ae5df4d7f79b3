"""Shapes of the synthetic qwen35moe models: a tiny one for tests, a small one for memory models, the real 35B-A3B.

Every matrix row length (hidden, expert FFN, attention output, GDN value width) is a multiple of 256 so that every
K- and IQ-quant block fits without per-tensor fallbacks: a tiny Q4_K model then runs the same kernels as the real one.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoinfer.errors import UserError


@dataclass(frozen=True)
class Preset:
    """Hyperparameters of one model shape (names follow the GGUF keys of llama.cpp's `qwen35moe`)."""

    name: str
    hidden: int
    n_layers: int
    n_experts: int
    n_experts_used: int
    expert_ffn: int
    shared_ffn: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dims: int
    rope_sections: tuple[int, int, int, int]
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_head_dim: int
    conv_kernel: int
    vocab_size: int
    context_length: int
    full_attention_interval: int = 4
    rope_base: float = 1.0e7
    rms_eps: float = 1.0e-6

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layer i is full attention iff (i+1) % interval == 0; the rest are Gated DeltaNet."""
        return tuple(i for i in range(self.n_layers) if (i + 1) % self.full_attention_interval == 0)

    @property
    def gdn_key_dim(self) -> int:
        return self.gdn_head_dim * self.gdn_key_heads

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_head_dim * self.gdn_value_heads

    @property
    def gdn_conv_channels(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # A few MB: one attention layer (i=3), 8 experts top-2; loads in well under a second.
        Preset(name="tiny", hidden=256, n_layers=4, n_experts=8, n_experts_used=2, expert_ffn=256, shared_ffn=256,
               n_head=2, n_head_kv=1, head_dim=128, rope_dims=32, rope_sections=(6, 5, 5, 0),
               gdn_key_heads=2, gdn_value_heads=4, gdn_head_dim=64, conv_kernel=4,
               vocab_size=1024, context_length=4096),
        # Tens of MB: two attention layers, 32 experts top-4; experts dominate the bytes as in the real model.
        Preset(name="small", hidden=512, n_layers=8, n_experts=32, n_experts_used=4, expert_ffn=256, shared_ffn=256,
               n_head=4, n_head_kv=1, head_dim=128, rope_dims=32, rope_sections=(6, 5, 5, 0),
               gdn_key_heads=4, gdn_value_heads=8, gdn_head_dim=64, conv_kernel=4,
               vocab_size=8192, context_length=32768),
        # Qwen3.5/3.6-35B-A3B text model: 34.66 B parameters, ~19.6 GB at Q4_K.
        Preset(name="35b-a3b", hidden=2048, n_layers=40, n_experts=256, n_experts_used=8, expert_ffn=512,
               shared_ffn=512, n_head=16, n_head_kv=2, head_dim=256, rope_dims=64, rope_sections=(11, 11, 10, 0),
               gdn_key_heads=16, gdn_value_heads=32, gdn_head_dim=128, conv_kernel=4,
               vocab_size=248320, context_length=262144),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; a UserError that lists the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
