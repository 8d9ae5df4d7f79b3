"""The Triton kernels that read GGUF blocks (ops/quant/kernels.py) against gguf.quants and the torch decoder, on
fresh random blocks, under TRITON_INTERPRET=1 on the CPU (the conftest sets it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from autoinfer.refengine.ops.quant import gemv, kernels
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
    # the torch decoder the loader and the host-side experts (misses: cpu) use agrees too
    assert torch.equal(torch_dequantize(raw, GGMLQuantizationType[qtype], tuple(ref.shape)), ref)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_matches_dense_product(qtype, m):
    n, k = 37, 768  # 37 rows: a masked row tail; 3 K blocks (24 for Q8_0): a masked block tail in steps of 2 (8)
    raw = random_blocks(qtype, n, k, seed=m)
    dense = reference(raw, qtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    out = gemv.qgemv(x, from_gguf(raw, qtype, (n, k)))
    assert out.shape == (m, n)
    assert rel(out, x @ dense.T) <= 1e-5


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows, blocks", [(1, 1), (4, 2), (16, 4), (32, 1)])
def test_gemv_tilings_agree(qtype, rows, blocks):
    """Every tiling the GPU heuristic can pick (rows per program, blocks per step) computes the same product."""
    n, k = 19, 512
    raw = random_blocks(qtype, n, k, seed=rows + blocks)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(blocks))
    out = gemv.qgemv(x, from_gguf(raw, qtype, (n, k)), config=gemv.GemvConfig(rows, blocks))
    assert rel(out, x @ reference(raw, qtype).T) <= 1e-5


def test_gemv_reads_bf16_activations():
    raw = random_blocks("Q4_K", 8, 256, seed=5)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    out = gemv.qgemv(x, from_gguf(raw, "Q4_K", (8, 256)), out_dtype=torch.float32)
    assert rel(out, x.float() @ reference(raw, "Q4_K").T) <= 1e-5


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


def stack(qtype: str, experts: int, n: int, k: int, seed: int) -> tuple[QuantWeight, torch.Tensor]:
    raw = random_blocks(qtype, experts * n, k, seed=seed)
    return (QuantWeight(torch.from_numpy(raw.reshape(experts, n, -1)), qtype, (experts, n, k)),
            reference(raw, qtype).view(experts, n, k))


@pytest.mark.parametrize("qtype", QTYPES)
def test_stacked_gemv_picks_rows_by_device_index_and_sums_under_weights(qtype):
    w, dense = stack(qtype, 6, 24, 256, seed=11)
    ids = torch.tensor([4, 1, 4])  # 3 items: padded to 4 inside the kernel, the pad must count for nothing
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 256, generator=gen)
    coef = torch.rand(3, generator=gen)
    each = gemv.qgemv(x, w, ids)
    assert rel(each, torch.einsum("ank,ak->an", dense[ids], x)) <= 1e-5
    summed = gemv.qgemv(x, w, ids, coef, out_dtype=torch.float32)
    assert summed.shape == (1, 24) and rel(summed[0], torch.einsum("ank,ak,a->n", dense[ids], x, coef)) <= 1e-5
    shared_x = gemv.qgemv(x[:1], w, ids)  # one input row for every item (a decode token's experts)
    assert rel(shared_x, torch.einsum("ank,k->an", dense[ids], x[0])) <= 1e-5


@pytest.mark.parametrize("qtype", QTYPES)
def test_glu_gemv_is_silu_gate_times_up(qtype):
    gate, gate_dense = stack(qtype, 4, 16, 256, seed=21)
    up, up_dense = stack(qtype, 4, 16, 256, seed=22)
    ids = torch.tensor([3, 0])
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(4))
    out = gemv.qgemv(x, gate, ids, up=up)
    want = F.silu(torch.einsum("ank,k->an", gate_dense[ids], x[0])) * torch.einsum("ank,k->an", up_dense[ids], x[0])
    assert rel(out, want) <= 1e-5
    plain = gemv.qgemv(x, gate[1], up=up[1])  # a single matrix pair (the shared expert)
    assert rel(plain, F.silu(x @ gate_dense[1].T) * (x @ up_dense[1].T)) <= 1e-5


def test_grouping_sorts_assignments_into_blocks_of_one_matrix():
    row = torch.tensor([3, 0, 3, 3, 1, 0])
    g = kernels.group_by_matrix(row, 4, block=2)
    assert g.item.tolist() == [1, 5, 4, -1, 0, 2, 3, -1]  # matrix 0: 2 rows, 1: 1 + pad, 2: none, 3: 3 + pad
    assert g.matrix.tolist() == [0, 1, 3, 3]


@pytest.mark.parametrize("qtype", QTYPES)
def test_grouped_gemm_multiplies_each_row_by_its_blocks_matrix(qtype):
    w, dense = stack(qtype, 5, 24, 256, seed=31)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(9, 256, generator=gen)
    row = torch.randint(0, 5, (20,), generator=gen)  # 20 assignments of 9 tokens to 5 experts
    token = torch.randint(0, 9, (20,), generator=gen)
    g = kernels.group_by_matrix(row, 5, block=16)
    x_rows = torch.where(g.item >= 0, token[g.item.clamp(min=0)], -1)
    out = kernels.qgemm_grouped(x, w, x_rows, g)
    real = g.item >= 0
    want = torch.einsum("ank,ak->an", dense[row[g.item[real]]], x[x_rows[real]])
    assert rel(out[real], want) <= 1e-5
    assert torch.all(out[~real] == 0)  # padding rows read zeros


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    from autoinfer.errors import UserError

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UserError, match="device: cuda"):
        kernels.check_device("cpu")
