"""The torch Q8_0/Q4_0 decoders against gguf.quants on fresh random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from autoinfer.refengine.ops.quant.dequant import dequantize


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0])
def test_fast_dequant_is_bit_identical_to_gguf_quants(qtype):
    x = np.random.default_rng(int(qtype)).standard_normal((3, 48, 64)).astype(np.float32)
    raw = quants.quantize(x, qtype)
    ref = quants.dequantize(raw, qtype)
    assert torch.equal(dequantize(raw, qtype, x.shape), torch.from_numpy(ref))


def test_other_types_go_through_gguf_quants():
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    raw = quants.quantize(x, GGMLQuantizationType.BF16)
    assert torch.equal(dequantize(raw, GGMLQuantizationType.BF16, x.shape),
                       torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.BF16)))


def test_q4_k_decoder_matches_gguf_quants_on_random_blocks():
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, size=(6, 144), dtype=np.uint8)  # random super-blocks with finite fp16 scales
    raw[:, 0:4] = np.array([0.01, 0.003], dtype=np.float16).view(np.uint8)
    ref = quants.dequantize(raw, GGMLQuantizationType.Q4_K)
    out = dequantize(raw, GGMLQuantizationType.Q4_K, ref.shape)
    assert torch.equal(out, torch.from_numpy(ref))
