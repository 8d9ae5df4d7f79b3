"""What a qwen35moe GGUF holds, byte by byte: the numbers a placement memory model needs.

Only the header is read (autoinfer.model.gguf_header), so a 20 GB file costs milliseconds.
Every tensor lands in one group, by the part of the network that reads it:
embeddings, output (lm_head), norm (attn_norm, post_attention_norm, output_norm), attention (incl. its q/k norms),
gdn (Gated DeltaNet mixer incl. conv, ssm_norm), router, shared_expert (incl. its gate), routed_experts,
mtp (layers past the trunk: multi-token-prediction heads) and other (names this module does not know; shown, never
hidden).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from autoinfer.errors import UserError
from autoinfer.model.arch import ARCHES, Architecture
from autoinfer.model.gguf_header import GGUFFormatError, GGUFHeader, read_header

GROUPS = (
    "embeddings", "output", "norm", "attention", "gdn", "router", "shared_expert", "routed_experts", "mtp", "other",
)
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_NORMS = ("attn_norm.weight", "post_attention_norm.weight")
_ROUTED = re.compile(r"^ffn_(gate|up|down|gate_up)_(ch)?exps\.")
_SHARED = re.compile(r"^ffn_(gate_inp|gate|up|down)_shexp\.")
_ROUTER = re.compile(r"^ffn_gate_inp\.")
_GDN = re.compile(r"^(ssm_|attn_qkv\.|attn_gate\.)")
_ATTENTION = re.compile(r"^attn_")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: `shape` in ggml `ne` order (row length first); layer is None outside blk.N."""

    name: str
    layer: int | None
    group: str
    ggml_type: str
    n_bytes: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    """The architecture and every tensor of one qwen35moe/qwen3next GGUF.

    `metadata` holds every header key; arrays longer than gguf_header.MAX_KEPT_ARRAY (the tokenizer) as ArrayCount.
    """

    path: Path
    arch: str
    architecture: Architecture
    tensors: tuple[TensorInfo, ...]
    file_bytes: int
    metadata: dict[str, object]

    @property
    def n_layers(self) -> int:
        return self.architecture.n_layers

    @property
    def n_experts(self) -> int:
        return self.architecture.n_experts

    @property
    def n_experts_used(self) -> int:
        return self.architecture.n_experts_used

    @property
    def hidden(self) -> int:
        return self.architecture.hidden

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return self.architecture.attention_layers

    @property
    def context_length(self) -> int:
        return self.architecture.context_length

    @property
    def vocab_size(self) -> int:
        """Rows of the token embedding."""
        return self.architecture.vocab

    @property
    def tensor_bytes(self) -> int:
        """All tensor data (what llama.cpp reports as model size)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors)

    def bytes_by_group(self) -> dict[str, int]:
        """Bytes per group, every group listed (zero where the file has none)."""
        out = dict.fromkeys(GROUPS, 0)
        for t in self.tensors:
            out[t.group] += t.n_bytes
        return out

    def layer_bytes(self) -> tuple[dict[str, int], ...]:
        """Per trunk layer, bytes per group (groups the layer has)."""
        out: list[dict[str, int]] = [{} for _ in range(self.n_layers)]
        for t in self.tensors:
            if t.layer is not None and t.layer < self.n_layers:
                out[t.layer][t.group] = out[t.layer].get(t.group, 0) + t.n_bytes
        return tuple(out)

    def expert_bytes_per_layer(self) -> tuple[int, ...]:
        """Per trunk layer, the bytes of all its routed experts (what -ncmoe moves to the CPU per layer)."""
        return tuple(d.get("routed_experts", 0) for d in self.layer_bytes())

    def expert_bytes(self, layer: int = 0) -> int:
        """Bytes of one routed expert (gate + up + down) of `layer`."""
        return self.expert_bytes_per_layer()[layer] // self.n_experts

    def active_bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: every dense tensor, top-k experts per layer, one embedding row.

        MTP layers are left out (llama.cpp does not run them in a normal decode).
        """
        total = 0
        for t in self.tensors:
            if t.group == "embeddings":
                total += t.n_bytes // self.vocab_size
            elif t.group == "routed_experts":
                total += t.n_bytes * self.n_experts_used // self.n_experts
            elif t.group != "mtp":
                total += t.n_bytes
        return total

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON: header numbers, group totals, per-layer expert bytes and every tensor."""
        d = asdict(self)
        d["path"] = str(self.path)
        d.update(n_layers=self.n_layers, n_experts=self.n_experts, n_experts_used=self.n_experts_used,
                 hidden=self.hidden, attention_layers=self.attention_layers, context_length=self.context_length,
                 vocab_size=self.vocab_size)
        d["tensor_bytes"] = self.tensor_bytes
        d["n_params"] = self.n_params
        d["bytes_by_group"] = self.bytes_by_group()
        d["expert_bytes_per_layer"] = list(self.expert_bytes_per_layer())
        d["active_bytes_per_token"] = self.active_bytes_per_token()
        return d


def _group(name: str, layer: int | None, n_layers: int, attention_layers: tuple[int, ...]) -> str:
    if layer is None:
        if name.startswith("token_embd."):
            return "embeddings"
        if name.startswith("output_norm."):
            return "norm"
        if name.startswith("output."):
            return "output"
        return "other"
    if layer >= n_layers:
        return "mtp"
    part = _LAYER.match(name).group(2)
    if part in _NORMS:
        return "norm"
    for pattern, group in ((_ROUTED, "routed_experts"), (_SHARED, "shared_expert"), (_ROUTER, "router")):
        if pattern.match(part):
            return group
    if layer in attention_layers:
        return "attention" if _ATTENTION.match(part) else "other"
    return "gdn" if _GDN.match(part) else "other"


def _open(path: Path) -> GGUFHeader:
    if not path.is_file():
        raise UserError(f"{path}: no such file; pass the path of a .gguf model")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UserError(f"{path}: not a GGUF file (starts with {magic!r}); pass a .gguf model")
    try:
        return read_header(path)
    except GGUFFormatError as exc:
        detail = repr(str(exc))[1:-1]  # names read from the file may hold newlines or control characters
        raise UserError(f"{path}: corrupt or truncated GGUF: {detail}; re-download or re-create it") from None


def read_info(path: Path | str) -> ModelInfo:
    """Architecture numbers and per-tensor bytes of a qwen35moe (or qwen3next) GGUF; UserError for anything else."""
    path = Path(path).absolute()
    stat = os.stat(path) if path.is_file() else None
    return _read_info(path, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)


@lru_cache(maxsize=16)
def _read_info(path: Path, size: int, mtime_ns: int) -> ModelInfo:
    """Cached per (path, size, mtime): callers may ask once per trial."""
    header = _open(path)
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHES:
        raise UserError(f"{path}: architecture {arch!r} is not supported; autoinfer models {', '.join(ARCHES)} GGUFs")
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embd is None or len(embd.shape) != 2:
        raise UserError(f"{path}: GGUF has no 2-D token_embd tensor; the file is incomplete, re-convert or recreate it")
    architecture = Architecture.from_metadata(header.metadata, arch, str(path), vocab=embd.shape[1])
    tensors = []
    for t in header.tensors:
        m = _LAYER.match(t.name)
        layer = int(m.group(1)) if m else None
        tensors.append(TensorInfo(
            name=t.name, layer=layer, group=_group(t.name, layer, architecture.n_layers, architecture.attention_layers),
            ggml_type=t.ggml_type, n_bytes=t.n_bytes, shape=t.shape,
        ))
    return ModelInfo(path=path, arch=arch, architecture=architecture, tensors=tuple(tensors),
                     file_bytes=header.file_bytes, metadata=header.metadata)
