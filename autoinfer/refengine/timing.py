"""How the reference engine is timed, the same way everywhere (the sweep's worker, benchmarks/refengine_bench.py):
llama-bench's method. One warm-up (the whole prompt, then one token); then per repetition a prefill of n_prompt
random tokens from an empty state (pp, tok/s) and n_gen single-token decode steps from an empty state (tg)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Samples:
    pp: list[float] = field(default_factory=list)  # prompt tok/s, one per repetition
    tg: list[float] = field(default_factory=list)  # generation tok/s
    engine_s: float = 0.0  # the timed work, summed


def random_tokens(vocab: int, seed: int) -> Callable[[int], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return lambda n: torch.randint(0, vocab, (n,), generator=gen).tolist()


def measure(engine, n_prompt: int, n_gen: int, repetitions: int, tokens: Callable[[int], list[int]],
            warm_up: bool = True) -> Samples:
    def timed(fn) -> float:
        engine.sync()
        t0 = time.perf_counter()
        fn()
        engine.sync()
        return time.perf_counter() - t0

    def decode_run(batch: list[int]) -> None:
        state = engine.new_state()
        for t in batch:
            engine.decode(t, state)

    if warm_up:
        if n_prompt:
            _, state = engine.prefill(tokens(n_prompt))
            engine.decode(tokens(1)[0], state)
        elif n_gen:
            decode_run(tokens(1))
    out = Samples()
    for _ in range(repetitions):
        if n_prompt:
            prompt = tokens(n_prompt)
            s = timed(lambda: engine.prefill(prompt))
            out.pp.append(n_prompt / s)
            out.engine_s += s
        if n_gen:
            batch = tokens(n_gen)
            s = timed(lambda: decode_run(batch))
            out.tg.append(n_gen / s)
            out.engine_s += s
    return out
