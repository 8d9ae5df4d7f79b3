"""The hyper-parameters of a qwen35moe network, read from GGUF metadata (keys under the `qwen35moe.` prefix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from autoinfer.errors import UserError

ARCH = "qwen35moe"


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of the hybrid GDN + attention MoE network. Names follow the paper/HF, not ggml."""

    n_layers: int
    hidden: int
    vocab: int
    n_heads: int  # full-attention query heads
    n_kv_heads: int
    head_dim: int
    rope_dims: int  # leading dims of each head that RoPE rotates (NeoX style)
    rope_theta: float
    rms_eps: float
    n_experts: int
    n_experts_used: int
    expert_ffn: int
    shared_ffn: int
    conv_kernel: int
    gdn_k_heads: int  # ssm.group_count
    gdn_v_heads: int  # ssm.time_step_rank
    gdn_head_dim: int  # ssm.state_size: key and value head dim
    attention_layers: tuple[int, ...]
    context_length: int

    @property
    def gdn_key_dim(self) -> int:
        return self.gdn_k_heads * self.gdn_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_v_heads * self.gdn_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    def is_attention(self, layer: int) -> bool:
        return layer in self.attention_layers

    @classmethod
    def from_metadata(cls, meta: Callable[[str], Any], source: str) -> "ModelConfig":
        """Build from a lookup `meta(key)` returning the value of `qwen35moe.<key>` or None when absent."""

        def need(key: str) -> Any:
            value = meta(key)
            if value is None:
                raise UserError(f"{source}: GGUF metadata {ARCH}.{key} is missing; the file is not a complete "
                                f"{ARCH} model (re-export it or make one with `autoinfer model synth`)")
            return value

        n_layers = int(need("block_count"))
        recurrent = meta("attention.recurrent_layers")
        if recurrent is not None:
            attention = tuple(i for i in range(n_layers) if not bool(recurrent[i]))
        else:
            interval = int(meta("full_attention_interval") or 4)
            attention = tuple(i for i in range(n_layers) if (i + 1) % interval == 0)
        head_dim = int(need("attention.key_length"))
        if int(meta("attention.value_length") or head_dim) != head_dim:
            raise UserError(f"{source}: attention key_length and value_length differ; {ARCH} needs them equal")
        cfg = cls(
            n_layers=n_layers,
            hidden=int(need("embedding_length")),
            vocab=int(meta("vocab_size") or 0),  # the loader checks it against token_embd
            n_heads=int(need("attention.head_count")),
            n_kv_heads=int(need("attention.head_count_kv")),
            head_dim=head_dim,
            rope_dims=int(need("rope.dimension_count")),
            rope_theta=float(meta("rope.freq_base") or 1e7),
            rms_eps=float(need("attention.layer_norm_rms_epsilon")),
            n_experts=int(need("expert_count")),
            n_experts_used=int(need("expert_used_count")),
            expert_ffn=int(need("expert_feed_forward_length")),
            shared_ffn=int(need("expert_shared_feed_forward_length")),
            conv_kernel=int(need("ssm.conv_kernel")),
            gdn_k_heads=int(need("ssm.group_count")),
            gdn_v_heads=int(need("ssm.time_step_rank")),
            gdn_head_dim=int(need("ssm.state_size")),
            attention_layers=attention,
            context_length=int(meta("context_length") or 4096),
        )
        if cfg.gdn_v_heads % cfg.gdn_k_heads:
            raise UserError(f"{source}: ssm.time_step_rank ({cfg.gdn_v_heads}) is not a multiple of "
                            f"ssm.group_count ({cfg.gdn_k_heads})")
        inner = meta("ssm.inner_size")
        if inner is not None and int(inner) != cfg.gdn_value_dim:
            raise UserError(f"{source}: ssm.inner_size {inner} != state_size·time_step_rank {cfg.gdn_value_dim}")
        if cfg.n_heads % cfg.n_kv_heads:
            raise UserError(f"{source}: head_count {cfg.n_heads} is not a multiple of head_count_kv {cfg.n_kv_heads}")
        if not 0 < cfg.n_experts_used <= cfg.n_experts:
            raise UserError(f"{source}: expert_used_count {cfg.n_experts_used} is not in 1..{cfg.n_experts}")
        if cfg.rope_dims % 2 or cfg.rope_dims > head_dim:
            raise UserError(f"{source}: rope.dimension_count {cfg.rope_dims} must be even and ≤ key_length {head_dim}")
        return cfg
