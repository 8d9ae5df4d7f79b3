"""The host's bookkeeping after each decode step of the CUDA-graph expert cache (StepExpertCache.after_step), per
policy, on the CPU: what a step waits for besides the GPU. On an H100 the lfu policy generated 20.7 tok/s against
lru's 106 at a higher hit rate (contest-h100-ctx32768.md), where each eviction scanned every slot.

The cache has the 35B-A3B's shape (40 layers, 256 experts, 8 a token) with one-byte experts, so copies cost nothing;
a step's choices are drawn per layer from a fixed skewed popularity (a Zipf law over a shuffled expert order, seeded)
and written where the device's fetch would log them (the resident expert's slot, else the layer's next spare).
Prints per policy and slot count: the hit rate and the bookkeeping's microseconds per step (median of --repeats runs
of --steps steps each, the policies interleaved).

    python benchmarks/expert_cache_bookkeeping.py --slots 2554
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from autoinfer.refengine.cache.experts import StepExpertCache
from autoinfer.refengine.ops.moe import ExpertBank

LAYERS, EXPERTS, K = 40, 256, 8


def routing(steps: int, skew: float, seed: int) -> torch.Tensor:
    """[steps, layers, K] expert choices: per layer, K distinct experts drawn by a Zipf popularity."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, EXPERTS + 1, dtype=torch.float64) ** skew
    order = torch.stack([torch.randperm(EXPERTS, generator=g) for _ in range(LAYERS)])
    out = torch.empty(steps, LAYERS, K, dtype=torch.long)
    for layer in range(LAYERS):
        picks = torch.multinomial(weights.expand(steps, -1), K, replacement=False, generator=g)
        out[:, layer] = order[layer][picks]
    return out


def run(policy: str, slots: int, choices: torch.Tensor) -> tuple[float, float]:
    """(hit rate, microseconds of after_step per step)."""
    host = [ExpertBank(*(torch.zeros(EXPERTS, 1, 1, dtype=torch.uint8) for _ in range(3))) for _ in range(LAYERS)]
    cache = StepExpertCache(host, slots, torch.device("cpu"), policy, K)
    spent = 0.0
    for step in choices:
        log_step(cache, step)
        started = time.perf_counter()
        cache.after_step()
        spent += time.perf_counter() - started
    return cache.stats.hit_rate, spent / len(choices) * 1e6


def log_step(cache: StepExpertCache, step: torch.Tensor) -> None:
    """What the device's fetch logs for a decode step's [layers, k] choices: each one's row, the resident slot or
    its layer's next spare."""
    rows = torch.empty_like(step)
    for layer in range(step.shape[0]):
        spare = iter(cache.spares[layer])
        for j, e in enumerate(step[layer].tolist()):
            row = int(cache.mirror[layer, e])
            rows[layer, j] = row if row >= 0 else next(spare)
    cache.log[:, 0] = step
    cache.log[:, 1] = rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, action="append", help="cache slots (repeatable; default 1644 and 2554)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skew", type=float, default=0.8, help="Zipf exponent of each layer's expert popularity")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    choices = routing(args.steps, args.skew, args.seed)
    print("| slots | policy | hit rate | bookkeeping µs per step (median) | runs (µs) |")
    print("|---|---|---|---|---|")
    for slots in args.slots or [1644, 2554]:
        times: dict[str, list[float]] = {"lru": [], "lfu": []}
        hits: dict[str, float] = {}
        for _ in range(args.repeats):
            for policy in times:
                hits[policy], us = run(policy, slots, choices)
                times[policy].append(us)
        for policy, us in times.items():
            print(f"| {slots} | {policy} | {hits[policy]:.1%} | {statistics.median(us):.0f} | "
                  f"{', '.join(f'{u:.0f}' for u in us)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
