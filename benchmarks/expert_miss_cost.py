"""What one expert-cache miss costs at batch 1 on this machine: copied to the device and run there (misses: copy)
against computed on the host (misses: cpu), for the 35B-A3B expert shape (hidden 2048, expert FFN 512; gate and up
in Q4_K, down in Q4_K as the synthetic stand-in writes it, or --down Q6_K as Q4_K_M files often have it).

The experts are one layer's 256 of random valid GGUF blocks in (pinned) host memory, each miss a different one, so
its blocks come from memory, not a CPU cache. Per miss, with the engine's own ops:
  copy            the expert's blocks host→device into a slot (3 copies from pinned memory)
  device FFN      the fused GEMV kernels of misses: copy on that slot (bf16 activations; ops/moe/fused.py)
  copy + device   both: what misses: copy spends on a miss
  host, decode    misses: cpu (cache/host.py): the token's activations to the host, the expert's blocks decoded to
                  fp32, SwiGLU, the weighted result back to the device and added
  host, decoded   the same for an expert in the host's LRU of decoded experts (decoded earlier, not since touched)
The expert cache's per-call bookkeeping (the same for hits) is left out. Repetitions are interleaved (every path
once per round, each leading in turn); medians with 95% bootstrap intervals, and each host path's median over copy
+ device's and over copy's (the intervals resample both). Host work runs on torch's intra-op threads (--threads,
default all this process may use). Without CUDA only the host paths are timed.

    python benchmarks/expert_miss_cost.py [--rounds 40] [--down Q6_K] [--threads 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch

from autoinfer.measure.stats import bootstrap_ci, compare
from autoinfer.model.presets import PRESETS
from autoinfer.refengine.cache.experts import host_banks
from autoinfer.refengine.cache.host import HostExperts
from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.ops.quant.qweight import BLOCKS, from_gguf

N_EXPERTS = 256  # one layer's experts: ~450 MB of Q4_K, well beyond any CPU cache
WARM = 48  # experts decoded ahead for the "host, decoded" path (fewer than the LRU holds)
_HALVES = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # fp16 scale fields of a block, kept small and finite


def random_stack(qtype: str, shape: tuple[int, ...], rng: np.random.Generator):
    """Random valid GGUF blocks of a stacked [R, N, K] weight (random quants, fp16 scales in [0.001, 0.02])."""
    values, nbytes = BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // values, nbytes), dtype=np.uint8)
    for off in _HALVES[qtype]:
        raw[..., off:off + 2] = rng.uniform(0.001, 0.02, size=raw.shape[:-1]).astype(np.float16)[..., None].view(
            np.uint8)
    return from_gguf(raw.reshape(*shape[:-1], -1), qtype, shape)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--down", choices=("Q4_K", "Q6_K"), default="Q4_K")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = PRESETS["35b-a3b"]
    E, F = cfg.hidden, cfg.expert_ffn
    rng = np.random.default_rng(0)
    bank = ExpertBank(random_stack("Q4_K", (N_EXPERTS, F, E), rng), random_stack("Q4_K", (N_EXPERTS, F, E), rng),
                      random_stack(args.down, (N_EXPERTS, E, F), rng))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    host = host_banks([bank], pin=cuda)
    expert_mib = sum(t.raw[0].numel() for t in (bank.gate, bank.up, bank.down)) / 2**20
    x = torch.randn(1, E, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    print(f"{cpu_name()}, {args.threads} torch threads; "
          f"{torch.cuda.get_device_name() if cuda else 'no CUDA device'}; torch {torch.__version__}")
    print(f"one expert: gate/up Q4_K {F}x{E}, down {args.down} {E}x{F}: {expert_mib:.2f} MiB of blocks")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e6

    on_host = HostExperts(host)
    order = iter(np.random.default_rng(1).permutation(np.arange(WARM, N_EXPERTS).repeat(args.rounds)).tolist())
    for e in range(WARM):  # in the LRU, and out of every CPU cache by the time a round reads them again
        on_host.matrices(0, e)
    y = torch.zeros(1, E, dtype=torch.float32, device=device)

    def host_miss(e: int) -> None:
        out, _ = on_host.run(0, x.cpu(), torch.tensor([e]), torch.ones(1))
        y.add_(out.to(device))

    def cold() -> None:
        e = next(order)
        host_miss(e)
        on_host.decoded.pop((0, e))  # keeps the LRU to the warm experts

    paths = {"host, decode": cold, "host, decoded": lambda: host_miss(int(rng.integers(WARM)))}
    if cuda:
        from autoinfer.refengine.ops.moe.fused import fused_experts

        slot = ExpertBank(*(t[:1].to(device) for t in (bank.gate, bank.up, bank.down)))
        first = torch.zeros(1, dtype=torch.long, device=device)  # token 0 through slot 0
        weight = torch.ones(1, device=device)

        def copy() -> None:
            e = next(order)
            for dst, src in zip((slot.gate, slot.up, slot.down), (host[0].gate, host[0].up, host[0].down)):
                dst.raw[0].copy_(src.raw[e], non_blocking=True)

        def device_ffn() -> None:
            y.add_(fused_experts(x, first, first, weight, slot))

        def copy_and_run() -> None:
            copy()
            device_ffn()

        paths = {"copy": copy, "device FFN": device_ffn, "copy + device": copy_and_run, **paths}
    for fn in paths.values():  # warm-up: kernels compiled, allocator and thread pool started
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(args.rounds):
        names = list(paths)[r % len(paths):] + list(paths)[:r % len(paths)]  # each path leads in turn
        for name in names:
            samples[name].append(timed(paths[name]))
    print()
    print("| path | median µs | 95% CI | ÷ copy + device [95% CI] | ÷ copy [95% CI] |")
    print("|---|---|---|---|---|")
    for name, values in samples.items():
        lo, hi = bootstrap_ci(values)
        ratios = ["", ""]
        if cuda and name.startswith("host"):
            for i, base in enumerate(("copy + device", "copy")):
                c = compare(values, samples[base])
                ratios[i] = f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}]"
        print(f"| {name} | {np.median(values):.0f} | [{lo:.0f}, {hi:.0f}] | {ratios[0]} | {ratios[1]} |")
    if cuda:
        copy_us = float(np.median(samples["copy"]))
        print(f"\nhost→device copy of one expert: {expert_mib * 2**20 / copy_us / 1e3:.1f} GB/s (pinned). A ratio "
              "above 1: the host path costs that many times as much per miss. In a decode step a missed expert's FFN "
              "shares the fused launches of the layer's hits, so ÷ copy is the closer comparison there.")
    else:
        print("\nThe copy paths (copy, device FFN, copy + device) need a CUDA GPU: run this on the GPU machine for the "
              "ratios.")
    print(f"{args.rounds} rounds, interleaved; every miss reads a different expert's blocks.")


if __name__ == "__main__":
    main()
