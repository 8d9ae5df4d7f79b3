"""The architecture of a qwen35moe network (hybrid Gated DeltaNet + attention, routed and shared experts): its numbers
read once from a GGUF header's metadata, and the same description for the synthetic presets.

Everything that needs a hyperparameter (the byte accounting, the memory and performance models, the synthetic
writer, the reference engine) takes it from an `Architecture`, so the rules (which layers are attention layers, how
big the recurrent state is) exist once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autoinfer.errors import UserError

ARCHES = ("qwen35moe", "qwen3next")
RUNNABLE_ARCH = "qwen35moe"  # the layout the synthetic writer and the reference engine implement
DEFAULT_ATTENTION_INTERVAL = 4  # llama.cpp's default for full_attention_interval
DEFAULT_ROPE_THETA = 1.0e7
MAX_BLOCKS = 65536  # per-layer tables are built over every layer: a corrupt 2^31 would never finish


def attention_layers(n_layers: int, interval: int = DEFAULT_ATTENTION_INTERVAL,
                     recurrent: list[Any] | None = None) -> tuple[int, ...]:
    """The full-attention layers, as llama.cpp decides them: from `attention.recurrent_layers` when the file has one
    entry per layer, else every `interval`-th layer (layer i iff (i + 1) % interval == 0); the rest are GDN."""
    if isinstance(recurrent, list) and len(recurrent) >= n_layers:
        return tuple(i for i in range(n_layers) if not recurrent[i])
    return tuple(i for i in range(n_layers) if (i + 1) % interval == 0)


@dataclass(frozen=True)
class Architecture:
    """Shapes and constants of the network. A number the file does not carry is 0 (llama.cpp's default where it has
    one); `missing()` lists what the forward pass needs and the file lacks."""

    n_layers: int  # trunk layers (multi-token-prediction layers past them are not counted)
    hidden: int
    vocab: int
    n_heads: int  # full-attention query heads
    n_kv_heads: int
    head_dim: int  # attention key length
    value_dim: int  # attention value length
    rope_dims: int  # leading dims of each head that RoPE rotates (NeoX style)
    rope_sections: tuple[int, ...]
    rope_theta: float
    rms_eps: float
    n_experts: int
    n_experts_used: int
    expert_ffn: int
    shared_ffn: int
    conv_kernel: int
    gdn_k_heads: int  # ssm.group_count
    gdn_v_heads: int  # ssm.time_step_rank
    gdn_head_dim: int  # ssm.state_size: key and value head dim of a GDN head
    attention_layers: tuple[int, ...]
    context_length: int
    full_attention_interval: int = DEFAULT_ATTENTION_INTERVAL
    nextn_layers: int = 0

    @property
    def gdn_key_dim(self) -> int:
        return self.gdn_k_heads * self.gdn_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_v_heads * self.gdn_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN's causal convolution: q, k and v side by side."""
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    @property
    def recurrent_state_bytes(self) -> int:
        """Per GDN layer and sequence: the f32 SSM state of every value head plus the conv state llama.cpp keeps."""
        return 4 * (self.gdn_v_heads * self.gdn_head_dim ** 2 + max(self.conv_kernel - 1, 0) * self.conv_dim)

    def is_attention(self, layer: int) -> bool:
        return layer in self.attention_layers

    def missing(self) -> list[str]:
        """GGUF keys (without the arch prefix) the forward pass needs that this description lacks."""
        needed = {"attention.head_count": self.n_heads, "attention.head_count_kv": self.n_kv_heads,
                  "attention.key_length": self.head_dim, "rope.dimension_count": self.rope_dims,
                  "attention.layer_norm_rms_epsilon": self.rms_eps,
                  "expert_feed_forward_length": self.expert_ffn,
                  "expert_shared_feed_forward_length": self.shared_ffn, "ssm.conv_kernel": self.conv_kernel,
                  "ssm.group_count": self.gdn_k_heads, "ssm.time_step_rank": self.gdn_v_heads,
                  "ssm.state_size": self.gdn_head_dim}
        return [key for key, value in needed.items() if not value]

    def check_runnable(self, source: str) -> None:
        """UserError naming the first reason a forward pass of this description cannot be built."""
        if missing := self.missing():
            raise UserError(f"{source}: GGUF metadata {RUNNABLE_ARCH}.{missing[0]} is missing; the file is not a "
                            f"complete {RUNNABLE_ARCH} model (re-export it or make one with `autoinfer model synth`)")
        problems = [
            (self.value_dim != self.head_dim, "attention key_length and value_length differ; "
                                              f"{RUNNABLE_ARCH} needs them equal"),
            (self.gdn_v_heads % self.gdn_k_heads != 0,
             f"ssm.time_step_rank ({self.gdn_v_heads}) is not a multiple of ssm.group_count ({self.gdn_k_heads})"),
            (self.n_heads % self.n_kv_heads != 0,
             f"head_count {self.n_heads} is not a multiple of head_count_kv {self.n_kv_heads}"),
            (self.rope_dims % 2 != 0 or self.rope_dims > self.head_dim,
             f"rope.dimension_count {self.rope_dims} must be even and ≤ key_length {self.head_dim}"),
        ]
        for bad, why in problems:
            if bad:
                raise UserError(f"{source}: {why}")

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], arch: str, source: str, *, vocab: int = 0) -> "Architecture":
        """From GGUF metadata (`{arch}.<key>` entries); `vocab` is the embedding's row count when the caller knows
        it. Required: block_count, embedding_length, context_length and the expert counts; the rest default to 0."""
        get = _reader(meta, arch, source)
        blocks = get("block_count", minimum=1)
        if blocks > MAX_BLOCKS:
            raise UserError(f"{source}: {arch}.block_count is {blocks}, more than any model has ({MAX_BLOCKS}); "
                            "the file is corrupt, re-convert or re-create it")
        nextn = get("nextn_predict_layers", default=0)
        if nextn >= blocks:
            raise UserError(f"{source}: {arch}.nextn_predict_layers ({nextn}) leaves no trunk layer of {blocks}; "
                            "the file is corrupt, re-convert or re-create it")
        n_layers = blocks - nextn
        n_experts = get("expert_count", minimum=1)
        used = get("expert_used_count")
        if used > n_experts:
            raise UserError(f"{source}: {arch}.expert_used_count ({used}) exceeds expert_count; the file is corrupt, "
                            "re-convert or re-create it")
        interval = get("full_attention_interval", default=DEFAULT_ATTENTION_INTERVAL, minimum=1)
        hidden = get("embedding_length")
        n_heads = get("attention.head_count", default=0)
        head_dim = get("attention.key_length", default=hidden // max(n_heads, 1) if n_heads else 0)
        sections = meta.get(f"{arch}.rope.dimension_sections")
        sections = sections if isinstance(sections, list) else []
        return cls(
            n_layers=n_layers, hidden=hidden, vocab=vocab or get("vocab_size", default=0),
            n_heads=n_heads, n_kv_heads=get("attention.head_count_kv", default=n_heads), head_dim=head_dim,
            value_dim=get("attention.value_length", default=head_dim),
            rope_dims=get("rope.dimension_count", default=0),
            rope_sections=tuple(v for v in sections if isinstance(v, int) and not isinstance(v, bool)),
            rope_theta=_number(meta, f"{arch}.rope.freq_base", DEFAULT_ROPE_THETA, source),
            rms_eps=_number(meta, f"{arch}.attention.layer_norm_rms_epsilon", 0.0, source),
            n_experts=n_experts, n_experts_used=used, expert_ffn=get("expert_feed_forward_length", default=0),
            shared_ffn=get("expert_shared_feed_forward_length", default=0),
            conv_kernel=get("ssm.conv_kernel", default=0), gdn_k_heads=get("ssm.group_count", default=0),
            gdn_v_heads=get("ssm.time_step_rank", default=0), gdn_head_dim=get("ssm.state_size", default=0),
            attention_layers=attention_layers(n_layers, interval, meta.get(f"{arch}.attention.recurrent_layers")),
            context_length=get("context_length"), full_attention_interval=interval, nextn_layers=nextn,
        )


def _reader(meta: Mapping[str, Any], arch: str, source: str) -> Callable[..., int]:
    """get(key, default=…, minimum=0): a non-negative integer key; a per-layer array gives its first layer's value,
    as llama.cpp's default; a missing key without a default is refused."""
    def get(key: str, default: int | None = None, minimum: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, list) and value:
            value = value[0]
        if value is None:
            raise UserError(f"{source}: GGUF lacks the integer {arch}.{key}; the file is incomplete, re-convert or "
                            "re-create it")
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{source}: {arch}.{key} is {value!r}, not an integer; the file is corrupt, re-convert or "
                            "re-create it")
        if value < minimum:
            raise UserError(f"{source}: {arch}.{key} is {value}, below {minimum}; the file is corrupt, re-convert or "
                            "re-create it")
        return value
    return get


def _number(meta: Mapping[str, Any], key: str, default: float, source: str) -> float:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise UserError(f"{source}: {key} is {value!r}, not a non-negative number; the file is corrupt, re-convert "
                        "or re-create it")
    return float(value)
