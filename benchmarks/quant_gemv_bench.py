"""Batch-1 quantized GEMV (refengine/ops/quant/kernels.py) on the GPU: bytes read per second against the device's
measured copy bandwidth, and time against a dense bf16 product of the same shape (torch/cuBLAS).

Decode at batch 1 is bound by the bytes of weights read, so the fraction of the copy bandwidth a kernel reaches is
the number that matters. Shapes are the 35B-A3B model's: an attention projection, the 8 selected experts of one
layer (stacked bank of 256, picked by ids on the device), and the lm_head. Rounds interleave the two kernels;
the ratio is the median over rounds with a bootstrap 95% interval.

    python benchmarks/quant_gemv_bench.py [--rounds 7]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from triton.testing import do_bench

from autoinfer.refengine.ops.quant import kernels
from autoinfer.refengine.ops.quant.qweight import BLOCKS, from_gguf

_HALVES = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # fp16 scale fields of a block, kept small and finite


def random_weight(qtype: str, shape: tuple[int, ...], seed: int):
    """Random valid GGUF blocks of a logical [..., N, K] weight."""
    rng = np.random.default_rng(seed)
    values, nbytes = BLOCKS[qtype]
    rows = int(np.prod(shape[:-1]))
    raw = rng.integers(0, 256, size=(rows, shape[-1] // values, nbytes), dtype=np.uint8)
    for off in _HALVES[qtype]:
        raw[:, :, off:off + 2] = rng.uniform(0.001, 0.02, size=raw.shape[:2]).astype(np.float16)[..., None].view(
            np.uint8)
    return from_gguf(raw.reshape(*shape[:-1], -1), qtype, shape).to("cuda")


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms / 1e3)


def bootstrap(values: list[float], n: int = 2000) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    arr = np.asarray(values)
    meds = np.median(rng.choice(arr, size=(n, arr.size)), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e9:.0f} GB/s")
    print("| qtype | shape | quantized MiB read | qgemv µs | GB/s | of copy bw | dense bf16 µs | dense/qgemv (95% CI) |")
    print("|---|---|---|---|---|---|---|---|")
    for qtype in ("Q8_0", "Q4_K", "Q6_K"):
        for label, shape, picks in (("attn 4096x2048", (4096, 2048), 0), ("8 of 256 experts 512x2048",
                                    (256, 512, 2048), 8), ("lm_head 248320x2048", (248320, 2048), 0)):
            w = random_weight(qtype, shape, seed=1)
            x = torch.randn(1, shape[-1], device="cuda", dtype=torch.bfloat16)
            if picks:
                ids = torch.randperm(shape[0], device="cuda")[:picks].to(torch.int32)
                coef = torch.rand(picks, device="cuda")
                dense = torch.randn(picks, *shape[1:], device="cuda", dtype=torch.bfloat16)
                quant = lambda: kernels.qgemv(x, w, ids, coef)  # noqa: E731
                ref = lambda: torch.einsum("k,enk->en", x[0], dense)  # noqa: E731
                read = picks * w[0].nbytes()
            else:
                dense = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
                quant = lambda: kernels.qgemv(x, w)  # noqa: E731
                ref = lambda: x @ dense.T  # noqa: E731
                read = w.nbytes()
            q_ms, d_ms = [], []
            for _ in range(args.rounds):
                q_ms.append(do_bench(quant, rep=50))
                d_ms.append(do_bench(ref, rep=50))
            q, d = float(np.median(q_ms)), float(np.median(d_ms))
            lo, hi = bootstrap([b / a for a, b in zip(q_ms, d_ms)])
            gbs = read / (q / 1e3)
            print(f"| {qtype} | {label} | {read / 2**20:.1f} | {q * 1e3:.1f} | {gbs / 1e9:.0f} | {gbs / bw:.1%} | "
                  f"{d * 1e3:.1f} | {d / q:.2f} ({lo:.2f}–{hi:.2f}) |")


if __name__ == "__main__":
    main()
