"""Byte accounting of qwen35moe GGUFs, and one-line errors for files that are not one."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from autoinfer.errors import UserError
from autoinfer.model.gguf_header import read_header
from autoinfer.model.gguf_info import GROUPS, read_info
from autoinfer.model.synth import cached_model, plan, synth


@pytest.fixture(scope="module")
def tiny_q4k():
    return cached_model("tiny", "Q4_K")


def test_groups_sum_to_the_total_and_match_the_plan(tiny_q4k):
    info = read_info(tiny_q4k)
    sp = plan("tiny", "Q4_K")
    by_group = info.bytes_by_group()
    assert tuple(by_group) == GROUPS
    assert sum(by_group.values()) == info.tensor_bytes == sp.tensor_bytes
    assert info.tensor_bytes < info.file_bytes
    assert [(t.name, t.ggml_type, t.n_bytes, t.shape) for t in info.tensors] == [
        (t.name, t.ggml_type, t.n_bytes, t.shape) for t in sp.tensors
    ]
    assert by_group["other"] == by_group["mtp"] == 0
    assert all(by_group[g] > 0 for g in GROUPS[:8])


def test_architecture_numbers(tiny_q4k):
    info = read_info(tiny_q4k)
    p = plan("tiny", "Q4_K").arch
    assert (info.arch, info.n_layers, info.n_experts, info.n_experts_used, info.hidden) == (
        "qwen35moe", p.n_layers, p.n_experts, p.n_experts_used, p.hidden)
    assert info.attention_layers == (3,)
    assert (info.context_length, info.vocab_size) == (p.context_length, p.vocab)
    assert info.metadata["qwen35moe.ssm.group_count"] == p.gdn_k_heads
    assert info.metadata["autoinfer.synth.preset"] == "tiny"


def test_layer_groups_follow_the_layer_type(tiny_q4k):
    info = read_info(tiny_q4k)
    layers = info.layer_bytes()
    assert len(layers) == 4
    assert {"attention"} <= set(layers[3]) and "gdn" not in layers[3]
    assert all("gdn" in layers[i] and "attention" not in layers[i] for i in (0, 1, 2))
    for t in info.tensors:
        if t.name.endswith(("attn_qkv.weight", "attn_gate.weight")):
            assert t.group == "gdn"
        if t.name.endswith(("attn_q_norm.weight", "attn_output.weight")):
            assert t.group == "attention"


def test_expert_bytes(tiny_q4k):
    info = read_info(tiny_q4k)
    per_layer = info.expert_bytes_per_layer()
    exps = [t for t in info.tensors if "_exps" in t.name]
    assert len(per_layer) == 4 and sum(per_layer) == sum(t.n_bytes for t in exps)
    assert per_layer[2] == sum(t.n_bytes for t in exps if t.layer == 2)
    # one Q4_K expert: gate + up + down, 3 * hidden * ffn values at 144 bytes per 256
    assert info.expert_bytes() * info.n_experts == per_layer[0]
    assert info.expert_bytes() == 3 * 256 * 256 // 256 * 144


def test_active_bytes_per_token(tiny_q4k):
    info = read_info(tiny_q4k)
    g = info.bytes_by_group()
    dense = sum(n for k, n in g.items() if k not in ("embeddings", "routed_experts"))
    expected = dense + info.n_experts_used * sum(info.expert_bytes(i) for i in range(info.n_layers)) \
        + g["embeddings"] // info.vocab_size
    assert info.active_bytes_per_token() == expected
    assert info.active_bytes_per_token() < info.tensor_bytes


def test_header_reader_agrees_with_gguf_reader(tmp_path):
    path = synth(tmp_path / "m.gguf", "tiny", "IQ4_XS")
    mine, theirs = read_header(path), GGUFReader(path)
    assert mine.data_offset == theirs.data_offset
    assert [(t.name, t.ggml_type, t.n_bytes, t.offset, t.shape) for t in mine.tensors] == [
        (t.name, t.tensor_type.name, int(t.n_bytes), int(t.data_offset), tuple(int(d) for d in t.shape))
        for t in theirs.tensors
    ]
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            value = field.contents()
            assert mine.metadata[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_rereads_a_file_that_changed(tmp_path):
    path = synth(tmp_path / "m.gguf", "tiny", "Q8_0")
    before = read_info(path).tensor_bytes
    time.sleep(0.01)
    synth(path, "tiny", "IQ2_XXS")
    assert read_info(path).tensor_bytes == plan("tiny", "IQ2_XXS").tensor_bytes < before


def _header_only_gguf(path, arch: str, tensors: dict[str, tuple[int, ...]], **ints: int) -> None:
    """A small GGUF with zero-filled F32 tensors, for layouts the synthesizer never writes."""
    w = GGUFWriter(path, arch)
    for key, value in ints.items():
        w.add_uint32(f"{arch}.{key}", value)
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(tuple(reversed(shape)), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


KEYS = {"block_count": 2, "embedding_length": 32, "expert_count": 4, "expert_used_count": 2, "context_length": 64}


def test_mtp_layers_and_unknown_tensors_are_grouped_not_hidden(tmp_path):
    path = tmp_path / "mtp.gguf"
    _header_only_gguf(path, "qwen35moe", {
        "token_embd.weight": (32, 8),
        "blk.0.attn_norm.weight": (32,),
        "blk.0.ffn_gate_exps.weight": (32, 8, 4),
        "blk.0.mystery.weight": (32,),
        "blk.1.nextn.eh_proj.weight": (64, 32),
        "blk.1.ffn_up_exps.weight": (32, 8, 4),
    }, **KEYS, nextn_predict_layers=1)
    info = read_info(path)
    assert info.n_layers == 1
    groups = {t.name: t.group for t in info.tensors}
    assert groups["blk.1.nextn.eh_proj.weight"] == groups["blk.1.ffn_up_exps.weight"] == "mtp"
    assert groups["blk.0.mystery.weight"] == "other"
    assert info.expert_bytes_per_layer() == (32 * 8 * 4 * 4,)
    assert sum(info.bytes_by_group().values()) == info.tensor_bytes


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_info(tmp_path / "absent.gguf")
    with pytest.raises(UserError, match="no such file"):
        read_info(tmp_path)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, long enough to have a header's worth of bytes")
    with pytest.raises(UserError, match="not a GGUF file"):
        read_info(path)


@pytest.mark.parametrize("cut", [10, 100, 5000, -1000, -1])
def test_truncated_file(cut, tmp_path, tiny_q4k):
    data = tiny_q4k.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(UserError, match=r"cut\.gguf: corrupt or truncated GGUF: .*(end of the file|truncated|short)"):
        read_info(path)


def test_corrupt_array_length_fails_fast_without_allocating(tmp_path, tiny_q4k):
    """An array that claims 2^40 elements must be refused from the file size, not read element by element."""
    data = bytearray(tiny_q4k.read_bytes())
    key = b"qwen35moe.rope.dimension_sections"
    at = data.index(key) + len(key) + 4 + 4  # after the key, the ARRAY type and the element type
    data[at:at + 8] = struct.pack("<Q", 1 << 40)
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    start = time.monotonic()
    with pytest.raises(UserError, match="corrupt or truncated GGUF: .*runs past the end"):
        read_info(path)
    assert time.monotonic() - start < 1


def test_unknown_tensor_type_is_corrupt(tmp_path, tiny_q4k):
    data = bytearray(tiny_q4k.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8  # after the name, n_dims and two dims
    data[at:at + 4] = struct.pack("<I", 999)
    path = tmp_path / "type.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="unknown GGML type 999"):
        read_info(path)


def test_other_architecture(tmp_path):
    path = tmp_path / "llama.gguf"
    _header_only_gguf(path, "llama", {"token_embd.weight": (32, 8)}, block_count=1)
    with pytest.raises(UserError, match="architecture 'llama' is not supported"):
        read_info(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"expert_count": None}, "lacks the integer qwen35moe.expert_count"),
        ({"expert_count": 0}, "qwen35moe.expert_count is 0, below 1"),
        ({"full_attention_interval": 0}, "qwen35moe.full_attention_interval is 0, below 1"),
    ],
)
def test_missing_or_impossible_key(change, message, tmp_path):
    path = tmp_path / "keys.gguf"
    keys = {k: v for k, v in {**KEYS, **change}.items() if v is not None}
    _header_only_gguf(path, "qwen35moe", {"token_embd.weight": (32, 8)}, **keys)
    with pytest.raises(UserError, match=message):
        read_info(path)
