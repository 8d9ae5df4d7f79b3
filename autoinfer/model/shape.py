"""What the memory and performance models know of a model: its tensors with their bytes and the cache dimensions.

Built from a GGUF (`shape_from_gguf`, through the one architecture reader) or from the JSON beside a replay table,
so that a table measured on another machine can still be searched with the memory model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from autoinfer.model.gguf_info import read_info


@dataclass(frozen=True)
class TensorBytes:
    name: str
    layer: int | None
    group: str
    n_bytes: int


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about a model: tensors with their bytes and the cache dimensions.

    Built from a GGUF (`shape_from_gguf`) or from the JSON beside a replay table, so that a table measured on
    another machine can still be searched with the memory model.
    """

    n_layers: int
    n_experts: int
    n_experts_used: int
    hidden: int
    vocab: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    expert_ff: int
    attention_layers: tuple[int, ...]
    recurrent_state_bytes: int  # per recurrent (GDN) layer and sequence: f32 SSM state + conv state
    tensors: tuple[TensorBytes, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ModelShape":
        data = json.loads(text)
        data["attention_layers"] = tuple(data["attention_layers"])
        data["tensors"] = tuple(TensorBytes(**t) for t in data["tensors"])
        return cls(**data)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)


def shape_from_gguf(path: Path) -> ModelShape:
    """The shape of a qwen35moe-family GGUF: byte accounting and architecture from gguf_info (the bounded header
    reader: the tokenizer is counted, never materialised)."""
    info = read_info(path)
    a = info.architecture
    return ModelShape(
        n_layers=a.n_layers, n_experts=a.n_experts, n_experts_used=a.n_experts_used, hidden=a.hidden, vocab=a.vocab,
        n_head=a.n_heads, n_head_kv=a.n_kv_heads, key_length=a.head_dim, value_length=a.value_dim,
        expert_ff=a.expert_ffn, attention_layers=a.attention_layers, recurrent_state_bytes=a.recurrent_state_bytes,
        tensors=tuple(TensorBytes(t.name, t.layer, t.group, int(t.n_bytes)) for t in info.tensors),
    )
