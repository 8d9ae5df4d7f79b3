"""Random-weight qwen35moe GGUFs that llama.cpp loads and runs at the real model's speed per byte.

Real weights are not needed to measure speed: llama.cpp's cost depends on shapes, types and placement, not values.
The files follow llama.cpp's `qwen35moe` layout (src/models/qwen35moe.cpp) and are written one tensor at a time
(in bounded chunks), so the 19.6 GB 35B-A3B model needs little memory. A plan (names, shapes, types, bytes) is
computed first; the 35B shapes can be checked from it without writing anything.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from filelock import FileLock
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

from autoinfer.errors import UserError
from autoinfer.model.arch import Architecture
from autoinfer.model.gguf_header import read_header
from autoinfer.model.presets import get_preset
from autoinfer.model.weights import SUPPORTED_TYPES, block_size, n_bytes, tensor_chunks
from autoinfer.paths import cache_dir

ARCH = "qwen35moe"
# Bump when the bytes synth() writes for a given (preset, qtype, tokenizer, seed) change: it keys the cache.
FORMAT_VERSION = 2
WEIGHT_STD = 0.02
TOKENIZERS = ("none", "qwen35")
# The vocab-only GGUF from llama.cpp's models/ folder (MIT): ships with the package because an installed autoinfer
# may run against a llama.cpp binary without any source tree next to it.
QWEN35_VOCAB = Path(__file__).resolve().parents[1] / "data" / "ggml-vocab-qwen35.gguf"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to write: `shape` in ggml `ne` order (row length first), `init` = how its values are drawn."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_bytes: int
    init: str

    @property
    def n_params(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class SynthPlan:
    """Everything synth() will write, computed without writing: shapes, types and bytes of every tensor."""

    preset: str
    arch: Architecture
    qtype: str
    tokenizer: str
    vocab_size: int
    tensors: tuple[PlannedTensor, ...]

    @property
    def n_params(self) -> int:
        return sum(t.n_params for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def _layer_tensors(p: Architecture, il: int) -> list[tuple[str, tuple[int, ...], bool, str]]:
    """(name, ne shape, quantizable, init) of layer `il`, as llama_model_qwen35moe::load_arch_tensors expects."""
    E, blk = p.hidden, f"blk.{il}."
    out = [
        (blk + "attn_norm.weight", (E,), False, "norm"),
        (blk + "post_attention_norm.weight", (E,), False, "norm"),
    ]
    if il in p.attention_layers:
        HD = p.n_heads * p.head_dim
        kv = p.n_kv_heads * p.head_dim
        out += [
            (blk + "attn_q.weight", (E, 2 * HD), True, "normal"),  # per head: query rows then gate rows
            (blk + "attn_k.weight", (E, kv), True, "normal"),
            (blk + "attn_v.weight", (E, kv), True, "normal"),
            (blk + "attn_output.weight", (HD, E), True, "normal"),
            (blk + "attn_q_norm.weight", (p.head_dim,), False, "norm"),
            (blk + "attn_k_norm.weight", (p.head_dim,), False, "norm"),
        ]
    else:
        Vd, H = p.gdn_value_dim, p.gdn_v_heads
        out += [
            (blk + "attn_qkv.weight", (E, p.conv_dim), True, "normal"),
            (blk + "attn_gate.weight", (E, Vd), True, "normal"),
            (blk + "ssm_conv1d.weight", (p.conv_kernel, p.conv_dim), False, "conv"),
            (blk + "ssm_dt.bias", (H,), False, "dt_bias"),
            (blk + "ssm_a", (H,), False, "ssm_a"),
            (blk + "ssm_beta.weight", (E, H), True, "normal"),
            (blk + "ssm_alpha.weight", (E, H), True, "normal"),
            (blk + "ssm_norm.weight", (p.gdn_head_dim,), False, "norm"),
            (blk + "ssm_out.weight", (Vd, E), True, "normal"),
        ]
    F, Fs, X = p.expert_ffn, p.shared_ffn, p.n_experts
    out += [
        (blk + "ffn_gate_inp.weight", (E, X), False, "normal"),  # the router stays F32, as llama-quantize keeps it
        (blk + "ffn_gate_exps.weight", (E, F, X), True, "normal"),
        (blk + "ffn_up_exps.weight", (E, F, X), True, "normal"),
        (blk + "ffn_down_exps.weight", (F, E, X), True, "normal"),
        (blk + "ffn_gate_inp_shexp.weight", (E,), False, "normal"),
        (blk + "ffn_gate_shexp.weight", (E, Fs), True, "normal"),
        (blk + "ffn_up_shexp.weight", (E, Fs), True, "normal"),
        (blk + "ffn_down_shexp.weight", (Fs, E), True, "normal"),
    ]
    return out


def _validate(preset: str, qtype: str, tokenizer: str) -> Architecture:
    _check_choice("qtype", qtype, SUPPORTED_TYPES)
    _check_choice("tokenizer", tokenizer, TOKENIZERS)
    return get_preset(preset)


def plan(preset: str = "tiny", qtype: str = "Q8_0", tokenizer: str = "qwen35") -> SynthPlan:
    """The tensors of a synthetic model: matrices in `qtype`; norms, 1-D tensors, routers and conv weights in F32."""
    p = _validate(preset, qtype, tokenizer)
    vocab = p.vocab  # the tokenizer is fitted to the preset's vocabulary, so it never changes the tensors
    specs = [("token_embd.weight", (p.hidden, vocab), True, "normal")]
    for il in range(p.n_layers):
        specs += _layer_tensors(p, il)
    specs += [("output_norm.weight", (p.hidden,), False, "norm"), ("output.weight", (p.hidden, vocab), True, "normal")]
    tensors = []
    for name, shape, quantizable, init in specs:
        ggml_type = qtype if quantizable else "F32"
        if shape[0] % block_size(ggml_type):
            raise ValueError(f"{preset}: {name} rows of {shape[0]} do not fit {ggml_type} blocks")
        n_elements = int(np.prod(shape, dtype=np.int64))
        tensors.append(PlannedTensor(name, shape, ggml_type, n_bytes(ggml_type, n_elements), init))
    return SynthPlan(preset=preset, arch=p, qtype=qtype, tokenizer=tokenizer, vocab_size=vocab, tensors=tuple(tensors))


@cache
def _qwen35_tokenizer() -> dict[str, object]:
    """The tokenizer fields of the shipped Qwen3.5 vocab file (tokens, types, merges, special ids, template)."""
    header = read_header(QWEN35_VOCAB, max_kept_array=1 << 24)
    return {k: v for k, v in header.metadata.items() if k.startswith("tokenizer.")}


CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


@cache
def fitted_qwen35_tokenizer(n_vocab: int) -> dict[str, object]:
    """The Qwen3.5 tokenizer with exactly `n_vocab` tokens, so the embedding and output rows keep the preset's size.

    Fewer than the 151,936 tokens: the first ones by id (the 256 byte tokens, then the earliest merges), the merges
    made only of kept tokens, and the control tokens (<|endoftext|>, <|im_start|>, <|im_end|>) at the end; any text
    still tokenizes (BPE falls back to shorter pieces). More tokens: all of them, then `[PADn]` user-defined tokens,
    as the real 248,320-row model pads its vocabulary.
    """
    tok = _qwen35_tokenizer()
    tokens, types = list(tok["tokenizer.ggml.tokens"]), list(tok["tokenizer.ggml.token_type"])
    merges = list(tok["tokenizer.ggml.merges"])
    control = [i for i, t in enumerate(types) if t == CONTROL]
    special = {key: tok[key] for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                         "tokenizer.ggml.padding_token_id")}
    if n_vocab >= len(tokens):
        tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
        types += [USER_DEFINED] * (n_vocab - len(types))
    else:
        n_regular = n_vocab - len(control)
        if n_regular < 256 or any(t != 1 for t in types[:n_regular]):
            raise UserError(f"a vocabulary of {n_vocab} tokens cannot hold the qwen35 tokenizer's byte and control "
                            f"tokens; use at least {256 + len(control)} tokens or --tokenizer none")
        new_id = {old: n_regular + k for k, old in enumerate(control)}
        tokens = tokens[:n_regular] + [tokens[i] for i in control]
        types = types[:n_regular] + [CONTROL] * len(control)
        kept = set(tokens[:n_regular])
        merges = [m for m in merges if (pair := m.split(" ", 1)) and all(x in kept for x in pair)
                  and "".join(pair) in kept]
        special = {key: new_id[value] for key, value in special.items()}
    return {**tok, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, **special}


def _add_metadata(w: GGUFWriter, sp: SynthPlan, seed: int) -> None:
    p = sp.arch
    w.add_name(f"autoinfer synthetic qwen35moe {sp.preset} {sp.qtype}")
    w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.hidden)
    w.add_block_count(p.n_layers)
    w.add_head_count(p.n_heads)
    w.add_head_count_kv(p.n_kv_heads)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.value_dim)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_rope_dimension_count(p.rope_dims)
    w.add_rope_dimension_sections(list(p.rope_sections))
    w.add_rope_freq_base(p.rope_theta)
    w.add_expert_count(p.n_experts)
    w.add_expert_used_count(p.n_experts_used)
    w.add_expert_feed_forward_length(p.expert_ffn)
    w.add_expert_shared_feed_forward_length(p.shared_ffn)
    w.add_full_attention_interval(p.full_attention_interval)
    w.add_ssm_conv_kernel(p.conv_kernel)
    w.add_ssm_state_size(p.gdn_head_dim)
    w.add_ssm_group_count(p.gdn_k_heads)
    w.add_ssm_time_step_rank(p.gdn_v_heads)
    w.add_ssm_inner_size(p.gdn_value_dim)
    if sp.tokenizer == "none":
        w.add_tokenizer_model("none")
        w.add_vocab_size(sp.vocab_size)
    else:
        tok = fitted_qwen35_tokenizer(sp.vocab_size)
        w.add_tokenizer_model(tok["tokenizer.ggml.model"])
        w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
        w.add_token_list(tok["tokenizer.ggml.tokens"])
        w.add_token_types(tok["tokenizer.ggml.token_type"])
        w.add_token_merges(tok["tokenizer.ggml.merges"])
        w.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"])
        w.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"])
        w.add_chat_template(tok["tokenizer.chat_template"])
    # Provenance: what made this file, so a result can be traced back to it.
    w.add_string("autoinfer.synth.preset", sp.preset)
    w.add_string("autoinfer.synth.qtype", sp.qtype)
    w.add_string("autoinfer.synth.tokenizer", sp.tokenizer)
    w.add_uint32("autoinfer.synth.seed", seed)
    w.add_uint32("autoinfer.synth.format_version", FORMAT_VERSION)
    w.add_float32("autoinfer.synth.weight_std", WEIGHT_STD)


def _write(path: Path, sp: SynthPlan, seed: int, progress: Progress | None) -> None:
    """Header, then each tensor's data chunk by chunk (as GGUFWriter.write_tensor_data, without one big array)."""
    w = GGUFWriter(path, ARCH)
    _add_metadata(w, sp, seed)
    for t in sp.tensors:
        qt = GGMLQuantizationType[t.ggml_type]
        byte_shape = (*reversed(t.shape[1:]), n_bytes(t.ggml_type, t.shape[0]))
        w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.n_bytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    done, total = 0, sp.tensor_bytes
    for t in sp.tensors:
        rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
        w.write_padding(fout, fout.tell())
        written = 0
        for chunk in tensor_chunks(t.ggml_type, t.shape, t.init, rng, WEIGHT_STD):
            chunk.tofile(fout)
            written += chunk.nbytes
            if progress is not None:
                progress(done + written, total)
        if written != t.n_bytes:
            raise RuntimeError(f"{t.name}: wrote {written} bytes, planned {t.n_bytes}")
        w.write_padding(fout, written)
        done += written
    w.close()


def synth(
    out: Path | str,
    preset: str = "tiny",
    qtype: str = "Q8_0",
    *,
    seed: int = 0,
    tokenizer: str = "qwen35",
    progress: Progress | None = None,
) -> Path:
    """Write a random-weight qwen35moe GGUF to `out` (atomically: a temp file renamed into place) and return its path.

    `progress(bytes_done, bytes_total)` is called as tensor data is written.
    """
    out = Path(out)
    sp = plan(preset, qtype, tokenizer)
    if not out.parent.is_dir():
        raise UserError(f"{out.parent} is not a directory; create it or choose another output path")
    free = shutil.disk_usage(out.parent).free
    if free < sp.tensor_bytes + (64 << 20):
        raise UserError(
            f"{out.parent} has {free / 2**30:.1f} GiB free but the {preset} {qtype} model needs "
            f"{sp.tensor_bytes / 2**30:.1f} GiB; free space or write elsewhere"
        )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        _write(tmp, sp, seed, progress)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def cached_model(preset: str = "tiny", qtype: str = "Q8_0", tokenizer: str = "qwen35", *, seed: int = 0) -> Path:
    """A synthetic model under cache_dir()/models/, written once per machine (concurrent callers wait, never see
    half a file): keyed by format version, preset, qtype, tokenizer and seed."""
    _validate(preset, qtype, tokenizer)
    folder = cache_dir() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"synth-v{FORMAT_VERSION}-{preset}-{qtype}-{tokenizer}-s{seed}.gguf"
    if path.exists():
        return path
    with FileLock(path.with_suffix(".lock")):
        if not path.exists():
            synth(path, preset, qtype, seed=seed, tokenizer=tokenizer)
    return path
