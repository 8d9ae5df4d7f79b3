"""The Triton kernels that read GGUF blocks (ops/quant/kernels.py) against gguf.quants and the torch decoder, on
fresh random blocks, under TRITON_INTERPRET=1 on the CPU (the conftest sets it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from autoinfer.refengine.ops.quant import kernels
from autoinfer.refengine.ops.quant.dequant import dequantize as torch_dequantize
from autoinfer.refengine.ops.quant.qweight import BLOCKS, QuantWeight, from_gguf

QTYPES = ["Q8_0", "Q4_K", "Q6_K"]
# fp16 field offsets (bytes) of each block: scales kept small and finite, every other byte random
_HALVES = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, rows: int, k: int, seed: int) -> np.ndarray:
    """Random GGUF rows [rows, row_bytes]: random quants and sub-block scales, fp16 scales in [0.001, 0.02]."""
    rng = np.random.default_rng(seed)
    values, nbytes = BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(rows, k // values, nbytes), dtype=np.uint8)
    for off in _HALVES[qtype]:
        raw[:, :, off:off + 2] = rng.uniform(0.001, 0.02, size=raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, qtype: str) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequant_kernel_is_exact_against_gguf_quants(qtype):
    raw = random_blocks(qtype, 5, 512, seed=1)
    ref = reference(raw, qtype)
    w = from_gguf(raw, qtype, tuple(ref.shape))
    out = kernels.dequantize(w)
    assert torch.equal(out, ref)
    if qtype in ("Q8_0", "Q4_K"):  # the torch decoder the loader uses agrees too
        assert torch.equal(torch_dequantize(raw, GGMLQuantizationType[qtype], tuple(ref.shape)), ref)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_matches_dense_product(qtype, m):
    n, k = 37, 512  # n not a multiple of the row tile: the masked tail is exercised
    raw = random_blocks(qtype, n, k, seed=m)
    dense = reference(raw, qtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    out = kernels.qgemv(x, from_gguf(raw, qtype, (n, k)))
    assert out.shape == (m, n)
    assert rel(out, x @ dense.T) <= 1e-5


@pytest.mark.parametrize("qtype", QTYPES)
def test_gemm_matches_dense_product(qtype):
    n, m, k = 70, 20, 512
    raw = random_blocks(qtype, n, k, seed=7)
    dense = reference(raw, qtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3))
    out = kernels.qgemm(x, from_gguf(raw, qtype, (n, k)))
    assert out.shape == (m, n)
    assert rel(out, x @ dense.T) <= 1e-5
    assert torch.equal(kernels.qlinear(x, from_gguf(raw, qtype, (n, k))), out)  # 20 rows > GEMV_MAX_ROWS


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_stacked_gemv_picks_rows_by_device_index_and_sums_under_weights(qtype):
    experts, n, k = 6, 24, 256
    raw = random_blocks(qtype, experts * n, k, seed=11)
    dense = reference(raw, qtype).view(experts, n, k)
    stack = QuantWeight(torch.from_numpy(raw.reshape(experts, n, -1)), qtype, (experts, n, k))
    ids = torch.tensor([4, 1, 4])
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, k, generator=gen)
    coef = torch.rand(3, generator=gen)
    each = kernels.qgemv(x, stack, ids)
    assert rel(each, torch.einsum("ank,ak->an", dense[ids], x)) <= 1e-5
    summed = kernels.qgemv(x, stack, ids, coef)
    assert rel(summed[0], torch.einsum("ank,ak,a->n", dense[ids], x, coef)) <= 1e-5
    shared_x = kernels.qgemv(x[:1], stack, ids)  # one input row for every item (a decode token's experts)
    assert rel(shared_x, torch.einsum("ank,k->an", dense[ids], x[0])) <= 1e-5


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    from autoinfer.errors import UserError

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UserError, match="device: cuda"):
        kernels.check_device("cpu")
