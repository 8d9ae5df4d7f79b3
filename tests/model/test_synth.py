"""Synthetic qwen35moe GGUFs: they load and run in the real llama.cpp, their bytes are what the plan says."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from autoinfer.errors import UserError
from autoinfer.measure.process import IsolatedProcess
from autoinfer.model.gguf_header import read_header
from autoinfer.model.gguf_info import read_info
from autoinfer.model.presets import PRESETS
from autoinfer.model.synth import QWEN35_VOCAB, WEIGHT_STD, cached_model, fitted_qwen35_tokenizer, plan, synth
from autoinfer.model.weights import (
    QUANTIZED_IN_PYTHON,
    RAW_TYPES,
    SUPPORTED_TYPES,
    random_blocks,
    tensor_chunks,
)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
def test_tiny_model_runs_in_llama_bench_and_sizes_agree(qtype, tmp_path, bench):
    path = synth(tmp_path / f"tiny-{qtype}.gguf", "tiny", qtype)
    records = bench(path)
    info = read_info(path)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 4)]
    for r in records:
        assert r["model_size"] == info.tensor_bytes == plan("tiny", qtype).tensor_bytes
        assert r["model_n_params"] == info.n_params
        assert all(math.isfinite(t) and t > 0 for t in r["samples_ts"])
    weights = {t.ggml_type for t in info.tensors if len(t.shape) >= 2 and t.group != "router" and "conv" not in t.name}
    assert weights == {qtype}


def test_small_preset_runs_in_llama_bench(bench):
    path = cached_model("small", "Q4_K")
    info = read_info(path)
    (pp, tg) = bench(path)
    assert pp["model_size"] == tg["model_size"] == info.tensor_bytes
    assert info.attention_layers == (3, 7) and info.n_experts == 32 and info.n_experts_used == 4


@pytest.mark.parametrize("qtype", ["Q4_K", "IQ2_XXS", "Q8_0"])
def test_logits_are_finite_and_near_uniform(qtype, tmp_path, run_tool):
    """Random weights at std 0.02 must give finite, nearly flat logits: perplexity within 2x of the vocabulary size."""
    path = synth(tmp_path / "m.gguf", "tiny", qtype, tokenizer="qwen35")
    words = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(300)))
    for _ in range(4):  # llama.cpp's log thread is not drained at exit: a fast run can lose its last line
        result = run_tool("llama-perplexity", "-m", str(path), "-f", str(text), "-c", "64", "-b", "64", "--chunks",
                          "2", "-t", "2")
        assert result.returncode == 0, result.stderr[-2000:]
        match = re.search(r"Final estimate: PPL = ([\d.naif]+)", result.stdout + result.stderr)
        if match:
            break
    assert match, (result.stdout + result.stderr)[-2000:]
    ppl = float(match.group(1))
    vocab = read_info(path).vocab_size
    assert 0.5 * vocab < ppl < 2 * vocab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_qwen35_tokenizer_tokenizes_in_llama_server(llama_tools, tool_env):
    path = cached_model("tiny", "Q4_K", "qwen35")
    tokens = read_header(path, max_kept_array=1 << 24).metadata["tokenizer.ggml.tokens"]
    assert read_info(path).vocab_size == len(tokens) == PRESETS["tiny"].vocab
    port = _free_port()
    argv = [llama_tools.tool("llama-server"), "-m", path, "--port", str(port), "-c", "256", "-t", "2", "-np", "1"]
    with IsolatedProcess(argv, env=tool_env) as server:
        deadline = time.monotonic() + 60
        while True:
            assert server.running, server.output()[1][-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy in 60 s"
            time.sleep(0.2)
        ids = _post(f"http://127.0.0.1:{port}/tokenize", {"content": "in the"})["tokens"]
        assert ids == [tokens.index("in"), tokens.index("Ġthe")]  # merges of the fitted vocabulary apply
        rare = _post(f"http://127.0.0.1:{port}/tokenize", {"content": "Hello world"})["tokens"]
        assert len(rare) > 2 and max(rare) < len(tokens)  # words beyond it fall back to shorter pieces
        text = _post(f"http://127.0.0.1:{port}/detokenize", {"tokens": rare})["content"]
        assert text == "Hello world"


def test_fitted_tokenizer_keeps_the_preset_vocabulary():
    full = read_header(QWEN35_VOCAB, max_kept_array=1 << 24).metadata
    small = fitted_qwen35_tokenizer(1024)
    tokens, types = small["tokenizer.ggml.tokens"], small["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 1024
    assert tokens[:1021] == full["tokenizer.ggml.tokens"][:1021]
    assert tokens[1021:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[1021:] == [3, 3, 3]
    assert small["tokenizer.ggml.eos_token_id"] == small["tokenizer.ggml.bos_token_id"] == 1021
    kept = set(tokens)
    merges = small["tokenizer.ggml.merges"]
    assert merges and all(a in kept and b in kept and a + b in kept for a, b in (m.split(" ", 1) for m in merges))
    big = fitted_qwen35_tokenizer(248320)
    assert len(big["tokenizer.ggml.tokens"]) == 248320 and big["tokenizer.ggml.tokens"][-1] == "[PAD248319]"
    assert big["tokenizer.ggml.merges"] == full["tokenizer.ggml.merges"]
    assert big["tokenizer.ggml.eos_token_id"] == full["tokenizer.ggml.eos_token_id"]
    assert plan("tiny", "Q8_0", "qwen35").tensor_bytes == plan("tiny", "Q8_0", "none").tensor_bytes
    with pytest.raises(UserError, match="cannot hold the qwen35 tokenizer"):
        fitted_qwen35_tokenizer(200)


def test_plan_of_35b_a3b_matches_the_real_model():
    sp = plan("35b-a3b", "Q4_K")
    assert round(sp.n_params / 1e9, 2) == 34.66
    top_k = sp.arch.n_experts_used / sp.arch.n_experts
    stack = sum(t.n_params * (top_k if "_exps" in t.name else 1) for t in sp.tensors
                if t.name.startswith("blk."))
    head = next(t.n_params for t in sp.tensors if t.name == "output.weight")
    assert round(stack / 1e9, 2) == 2.44 and round((stack + head) / 1e9, 2) == 2.95
    assert 19.5e9 < sp.tensor_bytes < 19.7e9  # the 19.6 GB file of the measured anchors
    expert = 3 * 2048 * 512
    assert all(t.n_params == 256 * expert / 3 for t in sp.tensors if "_exps" in t.name)
    assert len([t for t in sp.tensors if t.name.endswith("attn_q.weight")]) == 10
    assert len([t for t in sp.tensors if t.name.endswith("ssm_out.weight")]) == 30


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_fits_every_type_without_fallback(preset):
    for qtype in SUPPORTED_TYPES:
        sp = plan(preset, qtype)
        assert {t.ggml_type for t in sp.tensors} <= {qtype, "F32"}


def test_f32_tensors_are_norms_vectors_routers_and_conv():
    for t in plan("tiny", "Q4_K").tensors:
        is_f32_kind = len(t.shape) == 1 or "ffn_gate_inp." in t.name or "ssm_conv1d" in t.name
        assert (t.ggml_type == "F32") == is_f32_kind, t.name


@pytest.mark.parametrize("qtype", RAW_TYPES)
def test_raw_blocks_dequantize_to_the_requested_spread(qtype):
    blocks = random_blocks(qtype, 4096, np.random.default_rng(7), WEIGHT_STD)
    w = quants.dequantize(blocks, GGMLQuantizationType[qtype])
    assert np.isfinite(w).all()
    assert abs(w.std() / WEIGHT_STD - 1) < 0.05
    assert abs(w.mean()) < 0.1 * WEIGHT_STD


@pytest.mark.parametrize("qtype", QUANTIZED_IN_PYTHON + ("F16", "BF16"))
def test_python_quantized_chunks_dequantize_to_the_requested_spread(qtype):
    (chunk,) = tensor_chunks(qtype, (256, 64), "normal", np.random.default_rng(7), WEIGHT_STD)
    w = quants.dequantize(chunk.view(np.uint8), GGMLQuantizationType[qtype])
    assert abs(w.std() / WEIGHT_STD - 1) < 0.05


def test_big_tensors_are_written_in_bounded_chunks():
    shape = (2048, 512, 256)  # one 35B-A3B expert tensor: 268 M values
    chunks = tensor_chunks("Q4_K", shape, "normal", np.random.default_rng(0), WEIGHT_STD)
    first = next(chunks)
    assert first.nbytes <= (1 << 23) // 256 * 144
    assert first.nbytes + sum(c.nbytes for c in chunks) == 2048 * 512 * 256 // 256 * 144


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = synth(tmp_path / "a.gguf", "tiny", "Q4_K", seed=3)
    b = synth(tmp_path / "b.gguf", "tiny", "Q4_K", seed=3)
    c = synth(tmp_path / "c.gguf", "tiny", "Q4_K", seed=4)
    assert _sha(a) == _sha(b) != _sha(c)
    assert a.stat().st_size == c.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]  # no temp files left


def test_cached_model_is_written_once_even_when_processes_race(tmp_path):
    code = "from autoinfer.model.synth import cached_model; print(cached_model('tiny', 'Q4_0'))"
    env = {**os.environ, "AUTOINFER_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0]
    (path,) = map(Path, outputs)
    assert path.parent == tmp_path / "models"
    assert sorted(p.suffix for p in path.parent.iterdir()) == [".gguf", ".lock"]  # no half-written temp files
    assert read_info(path).tensor_bytes == plan("tiny", "Q4_0").tensor_bytes
    mtime = path.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert Path(again.stdout.strip()) == path and path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "huge"}, "unknown preset 'huge'"),
        ({"qtype": "Q7_K"}, "unknown qtype 'Q7_K'"),
        ({"tokenizer": "llama"}, "unknown tokenizer 'llama'"),
    ],
)
def test_bad_choices_are_user_errors(kwargs, message, tmp_path):
    with pytest.raises(UserError, match=message):
        synth(tmp_path / "m.gguf", **kwargs)
    with pytest.raises(UserError, match=message):
        cached_model(**kwargs)


def test_missing_output_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        synth(tmp_path / "no" / "m.gguf")
