"""GGUF loading: metadata → config, dequantization, and one clear error line for every broken input."""

from __future__ import annotations

import pytest
import torch
from hf_gguf import gguf_tensors, write_gguf

from autoinfer.errors import UserError
from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.loader import load, read_config
from autoinfer.refengine.options import EngineOptions


def test_config_comes_from_the_metadata(hf_model, hf_gguf):
    cfg, hf = read_config(hf_gguf), hf_model.config
    assert (cfg.n_layers, cfg.hidden, cfg.vocab) == (hf.num_hidden_layers, hf.hidden_size, hf.vocab_size)
    assert cfg.attention_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "full_attention")
    assert (cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim) == (2, 4, 16)
    assert cfg.rope_dims == 8 and cfg.n_experts == 8 and cfg.n_experts_used == 2


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load(tmp_path / "nope.gguf")
    text = tmp_path / "text.gguf"
    text.write_text("hello")
    with pytest.raises(UserError, match="bad magic"):
        load(text)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\xff")
    with pytest.raises(UserError, match="cannot parse"):
        load(truncated)


def test_wrong_tensor_shape_names_the_tensor(hf_model, tmp_path):
    tensors = gguf_tensors(hf_model)
    tensors["blk.1.attn_gate.weight"] = tensors["blk.1.attn_gate.weight"][:, :32].copy()
    path = write_gguf(hf_model, tmp_path / "bad.gguf", tensors=tensors)
    with pytest.raises(UserError, match=r"blk\.1\.attn_gate\.weight has shape \(64, 32\), expected \(64, 64\)"):
        load(path)


def test_missing_tensor_is_named(hf_model, tmp_path):
    tensors = gguf_tensors(hf_model)
    del tensors["blk.2.ssm_a"]
    with pytest.raises(UserError, match=r"blk\.2\.ssm_a is missing"):
        load(write_gguf(hf_model, tmp_path / "missing.gguf", tensors=tensors))


def test_quantized_synthetic_model_runs_in_every_dtype(tiny_model):
    prompt = list(range(1, 40))
    logits = {}
    for dtype in ("fp32", "bf16", "fp16"):
        engine = ReferenceEngine.from_gguf(tiny_model, EngineOptions(dtype=dtype))
        assert engine.model.w.embed.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16,
                                              "fp16": torch.float16}[dtype]
        logits[dtype], _ = engine.prefill(prompt)
        assert torch.isfinite(logits[dtype]).all()
    scale = float(logits["fp32"].abs().max())
    assert float((logits["bf16"] - logits["fp32"]).abs().max()) <= 0.1 * scale
    assert float((logits["fp16"] - logits["fp32"]).abs().max()) <= 0.02 * scale


# VmHWM, this process's peak RSS: ru_maxrss would count the parent's RSS at the fork that started it
_LOAD_RSS = """
import re, sys, psutil
from autoinfer.refengine.loader import load
before = psutil.Process().memory_info().rss
load(sys.argv[1], "bf16", keep_quant=True)
peak_kib = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
print((peak_kib * 1024 - before) / 2**20)
"""


def test_loading_holds_the_model_about_once_in_rss_not_the_file_beside_its_copy():
    """Each tensor is copied out of the file's mapping, and its mapped pages are dropped once it is: the process's
    RSS grew by 158 MiB loading the 123 MiB small Q8_0 model (the copies, 131), by 274 while the pages stayed."""
    import subprocess
    import sys

    from autoinfer.model.synth import cached_model

    model = cached_model("small", "Q8_0")
    out = subprocess.run([sys.executable, "-c", _LOAD_RSS, str(model)], capture_output=True, text=True, check=True)
    grew_mib = float(out.stdout.strip().splitlines()[-1])
    assert grew_mib < 1.5 * model.stat().st_size / 2**20
