"""GGUF → Architecture + torch weights. Quantized tensors are dequantized into the dtype asked for, or (keep_quant)
the matrices in Q8_0/Q4_K/Q6_K stay in their GGUF blocks as QuantWeight, read by the Triton kernels of ops/quant.

Weights keep llama.cpp's conventions (the same ones convert_hf_to_gguf writes): norm weights are plain
multipliers (HF's zero-centred 1 + w is already folded in), `ssm_a` is −exp(A_log), and the GDN value heads are in
tiled order (value head j reads key head j mod n_key_heads). numpy shapes are ggml's ne reversed, which is exactly
torch's Linear (out, in) layout.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from autoinfer.errors import UserError
from autoinfer.model.arch import RUNNABLE_ARCH, Architecture
from autoinfer.model.gguf_info import read_info
from autoinfer.refengine.cache.pinned import PinnedArena
from autoinfer.refengine.ops.quant.qweight import BLOCKS, QuantWeight, from_gguf

Matrix = torch.Tensor | QuantWeight  # a weight matrix: dense, or its GGUF blocks
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UserError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class AttentionWeights:
    q: Matrix  # (2·H·D, E): per head D query rows then D gate rows
    k: Matrix  # (Hkv·D, E)
    v: Matrix  # (Hkv·D, E)
    o: Matrix  # (E, H·D)
    q_norm: torch.Tensor  # (D,)
    k_norm: torch.Tensor  # (D,)
    in_proj: Matrix | None = None  # q, k, v stacked (q, k, v then views of it): model.fuse_projections


@dataclass(frozen=True)
class GdnWeights:
    qkv: Matrix  # (2K + Vd, E)
    z: Matrix  # (Vd, E): the output gate
    beta: Matrix  # (Hv, E)
    alpha: Matrix  # (Hv, E)
    conv: torch.Tensor  # (2K + Vd, kernel): depthwise causal conv
    dt_bias: torch.Tensor  # (Hv,)
    a: torch.Tensor  # (Hv,): −exp(A_log)
    norm: torch.Tensor  # (dv,): gated RMSNorm weight (plain multiplier)
    out: Matrix  # (E, Vd)
    in_proj: Matrix | None = None  # qkv, z, beta, alpha stacked (qkv…alpha then views of it): model.fuse_projections


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # (n_experts, E), fp32
    gate: Matrix  # (n_experts, F, E)
    up: Matrix  # (n_experts, F, E)
    down: Matrix  # (n_experts, E, F)
    shared_gate_inp: torch.Tensor  # (E,): sigmoid gate of the shared expert
    shared_gate: Matrix  # (Fs, E)
    shared_up: Matrix  # (Fs, E)
    shared_down: Matrix  # (E, Fs)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor
    post_norm: torch.Tensor
    mixer: AttentionWeights | GdnWeights
    moe: MoeWeights


@dataclass(frozen=True)
class ModelWeights:
    embed: Matrix  # (V, E): rows are gathered
    out_norm: torch.Tensor  # (E,)
    lm_head: Matrix  # (V, E)
    layers: tuple[LayerWeights, ...]

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> "ModelWeights":
        """A copy with fn(name, tensor) applied to every tensor (placement on a device, dtype changes)."""

        def one(name: str, v):
            if isinstance(v, torch.Tensor):
                return fn(name, v)
            if is_dataclass(v):  # a layer's weights, or a QuantWeight (its raw blocks are the tensor)
                return type(v)(**{k: one(f"{name}.{k}", sub) for k, sub in v.__dict__.items()})
            return v

        layers = tuple(one(f"layers.{i}", layer) for i, layer in enumerate(self.layers))
        return ModelWeights(one("embed", self.embed), one("out_norm", self.out_norm), one("lm_head", self.lm_head),
                            layers)


def _open(path: Path):
    import gguf

    path = Path(path)
    if not path.is_file():
        raise UserError(f"model file {path} does not exist; pass a .gguf path (or `autoinfer model synth`)")
    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise UserError(f"{path} is not a GGUF file (bad magic); pass a .gguf model")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as exc:  # noqa: BLE001 — any parse failure of a truncated/corrupt file
        raise UserError(f"{path}: cannot parse the GGUF file ({type(exc).__name__}: {exc}); the file is corrupt "
                        "or truncated — re-download or re-export it") from None


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_config(path: Path) -> Architecture:
    """Only the metadata: cheap, used to plan memory before loading anything."""
    reader = _open(path)
    cfg, _ = _config(reader, Path(path))
    return cfg


def _config(reader, path: Path) -> tuple[Architecture, dict]:
    arch = _field(reader, "general.architecture")
    if arch != RUNNABLE_ARCH:
        raise UserError(f"{path}: architecture is {arch!r}, the reference engine runs only {RUNNABLE_ARCH!r} models")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise UserError(f"{path}: tensor token_embd.weight is missing; the file is not a complete {RUNNABLE_ARCH} model")
    cfg = read_info(path).architecture
    cfg.check_runnable(str(path))
    return cfg, tensors


def _expected_shapes(cfg: Architecture) -> dict[str, tuple[int, ...]]:
    """numpy (torch) shape of every tensor, for validation with a message that names the tensor."""
    E, V, F, Fs, n = cfg.hidden, cfg.vocab, cfg.expert_ffn, cfg.shared_ffn, cfg.n_experts
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    shapes = {"token_embd.weight": (V, E), "output_norm.weight": (E,), "output.weight": (V, E)}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        shapes.update({b + "attn_norm.weight": (E,), b + "post_attention_norm.weight": (E,),
                       b + "ffn_gate_inp.weight": (n, E), b + "ffn_gate_exps.weight": (n, F, E),
                       b + "ffn_up_exps.weight": (n, F, E), b + "ffn_down_exps.weight": (n, E, F),
                       b + "ffn_gate_inp_shexp.weight": (E,), b + "ffn_gate_shexp.weight": (Fs, E),
                       b + "ffn_up_shexp.weight": (Fs, E), b + "ffn_down_shexp.weight": (E, Fs)})
        if cfg.is_attention(i):
            shapes.update({b + "attn_q.weight": (2 * H * D, E), b + "attn_k.weight": (Hkv * D, E),
                           b + "attn_v.weight": (Hkv * D, E), b + "attn_output.weight": (E, H * D),
                           b + "attn_q_norm.weight": (D,), b + "attn_k_norm.weight": (D,)})
        else:
            C, Vd, Hv = cfg.conv_dim, cfg.gdn_value_dim, cfg.gdn_v_heads
            shapes.update({b + "attn_qkv.weight": (C, E), b + "attn_gate.weight": (Vd, E),
                           b + "ssm_beta.weight": (Hv, E), b + "ssm_alpha.weight": (Hv, E),
                           b + "ssm_conv1d.weight": (C, cfg.conv_kernel), b + "ssm_dt.bias": (Hv,),
                           b + "ssm_a": (Hv,), b + "ssm_norm.weight": (cfg.gdn_head_dim,),
                           b + "ssm_out.weight": (E, Vd)})
    return shapes


class _Reader:
    """Dequantizes one tensor at a time so a large model never exists twice in fp32. Every tensor is copied out of
    the file's mapping, so once read its mapped pages are dropped from the process (they stay in the page cache):
    without that the process held the file's pages beside the copies while it loaded, twice the model in RSS."""

    def __init__(self, reader, tensors: dict, path: Path, shapes: dict[str, tuple[int, ...]], device: str,
                 keep_quant: bool = False):
        self.mapping = reader.data._mmap  # np.memmap's own mmap: numpy exposes no other handle on it
        self.tensors, self.path, self.shapes, self.device = tensors, path, shapes, device
        self.keep_quant = keep_quant

    def _release(self, t) -> None:
        """Drop t's pages from the mapping; a later read of them faults them in again, from the page cache."""
        start = t.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
        self.mapping.madvise(mmap.MADV_DONTNEED, start, t.data_offset + t.n_bytes - start)

    def matrix(self, name: str, dtype: torch.dtype) -> Matrix:
        """A weight matrix: its GGUF blocks when they are kept and a kernel reads the type, else dense."""
        t = self.tensors.get(name)
        if self.keep_quant and t is not None and t.tensor_type.name in BLOCKS:
            self._shape(name, t)
            out = from_gguf(np.asarray(t.data), t.tensor_type.name, self.shapes[name])
            self._release(t)
            return out
        return self(name, dtype)

    def matrix_bytes(self, name: str, dtype: torch.dtype) -> int:
        """What matrix(name, dtype) will hold, before it is read (0 for a missing tensor, which reading names)."""
        t = self.tensors.get(name)
        if t is None:
            return 0
        if self.keep_quant and t.tensor_type.name in BLOCKS:
            return int(t.n_bytes)
        return math.prod(self.shapes[name]) * dtype.itemsize

    def _shape(self, name: str, t) -> tuple[int, ...]:
        want = self.shapes[name]
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml ne → numpy order
        if tuple(d for d in shape if d != 1) == tuple(d for d in want if d != 1):
            shape = want  # ggml drops trailing 1s of ne: (1, E) and (E,) are the same tensor
        if shape != want:
            raise UserError(f"{self.path}: tensor {name} has shape {shape}, expected {want} "
                            "from the metadata; the file is inconsistent")
        return want

    def __call__(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        from autoinfer.refengine.ops.quant.dequant import dequantize

        t = self.tensors.get(name)
        if t is None:
            raise UserError(f"{self.path}: tensor {name} is missing; the file is not a complete {RUNNABLE_ARCH} model")
        want = self._shape(name, t)
        try:
            # Decoded on `device` (a GPU decodes a 35B model in seconds), returned on the CPU.
            out = dequantize(np.asarray(t.data), t.tensor_type, want, self.device).to(dtype).cpu()
        except NotImplementedError:
            raise UserError(f"{self.path}: tensor {name} has type {t.tensor_type.name}, which gguf.quants cannot "
                            "dequantize; requantize the model to Q8_0/Q4_0/F16/BF16/F32") from None
        self._release(t)
        return out


def load(path: Path, dtype: str = "fp32", decode_on: str = "cpu", pin_experts: bool = False,
         keep_quant: bool = False) -> tuple[Architecture, ModelWeights]:
    """Read a qwen35moe GGUF into CPU tensors. Norms, router, conv and decay parameters stay fp32.
    decode_on="cuda" dequantizes Q8_0/Q4_0 blocks on the GPU (the placement of the result is the engine's).
    pin_experts puts routed experts straight into pinned memory (packed: cache/pinned.py), so a model whose experts
    fill most of the host RAM never exists twice there (the expert cache copies from them asynchronously).
    keep_quant leaves the Q8_0/Q4_K/Q6_K matrices in their blocks (QuantWeight), the embedding table too (the rows a
    step needs are decoded then: a 35B-A3B table is 0.97 GiB in bf16, 0.27 GiB in Q4_K)."""
    path = Path(path)
    reader = _open(path)
    cfg, tensors = _config(reader, path)
    get = _Reader(reader, tensors, path, _expected_shapes(cfg), decode_on, keep_quant)
    mat = get.matrix
    big, f32 = torch_dtype(dtype), torch.float32
    experts = [f"blk.{i}.ffn_{g}_exps.weight" for i in range(cfg.n_layers) for g in ("gate", "up", "down")]
    arena = PinnedArena(sum(get.matrix_bytes(name, big) for name in experts)) if pin_experts else None
    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        if cfg.is_attention(i):
            mixer: AttentionWeights | GdnWeights = AttentionWeights(
                q=mat(b + "attn_q.weight", big), k=mat(b + "attn_k.weight", big), v=mat(b + "attn_v.weight", big),
                o=mat(b + "attn_output.weight", big), q_norm=get(b + "attn_q_norm.weight", f32),
                k_norm=get(b + "attn_k_norm.weight", f32))
        else:
            mixer = GdnWeights(
                qkv=mat(b + "attn_qkv.weight", big), z=mat(b + "attn_gate.weight", big),
                beta=mat(b + "ssm_beta.weight", big), alpha=mat(b + "ssm_alpha.weight", big),
                conv=get(b + "ssm_conv1d.weight", f32), dt_bias=get(b + "ssm_dt.bias", f32),
                a=get(b + "ssm_a", f32), norm=get(b + "ssm_norm.weight", f32), out=mat(b + "ssm_out.weight", big))
        expert = (lambda name: mat(name, big)) if arena is None else (lambda name: arena.place(mat(name, big)))
        moe = MoeWeights(
            router=get(b + "ffn_gate_inp.weight", f32), gate=expert(b + "ffn_gate_exps.weight"),
            up=expert(b + "ffn_up_exps.weight"), down=expert(b + "ffn_down_exps.weight"),
            shared_gate_inp=get(b + "ffn_gate_inp_shexp.weight", f32),
            shared_gate=mat(b + "ffn_gate_shexp.weight", big), shared_up=mat(b + "ffn_up_shexp.weight", big),
            shared_down=mat(b + "ffn_down_shexp.weight", big))
        layers.append(LayerWeights(get(b + "attn_norm.weight", f32), get(b + "post_attention_norm.weight", f32),
                                   mixer, moe))
    weights = ModelWeights(embed=mat("token_embd.weight", big), out_norm=get("output_norm.weight", f32),
                           lm_head=mat("output.weight" if "output.weight" in tensors else "token_embd.weight", big),  # tied
                           layers=tuple(layers))
    return cfg, weights
