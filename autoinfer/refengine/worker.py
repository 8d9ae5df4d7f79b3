"""One measurement of the reference engine in its own process (`python -m autoinfer.refengine.worker ...`), timed
as refengine/timing.py says (llama-bench's method).
The result is one JSON line on stdout. Exit status 2: the configuration was rejected; 3: the model could not be
loaded; 4: out of memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, TypeVar

T = TypeVar("T")
EXIT_REJECTED, EXIT_LOAD, EXIT_OOM = 2, 3, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from autoinfer.refengine.options import add_arguments

    p = argparse.ArgumentParser(prog="python -m autoinfer.refengine.worker")
    p.add_argument("--model", required=True)
    add_arguments(p)  # one flag per engine knob (refengine/options.py)
    p.add_argument("--n-prompt", type=int, default=512)
    p.add_argument("--n-gen", type=int, default=128)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    import dataclasses

    import torch

    from autoinfer.refengine.engine import ReferenceEngine
    from autoinfer.refengine.ops.moe.grouped import implementation
    from autoinfer.refengine.options import from_namespace
    from autoinfer.refengine.timing import measure as measure_engine
    from autoinfer.refengine.timing import random_tokens

    options = from_namespace(args)
    if args.max_context is None:  # the state holds what this measurement feeds it (a static one no more)
        options = dataclasses.replace(options, max_context=max(args.n_prompt + 1, args.n_gen, 1))
    options.check()
    cuda = options.device == "cuda"
    used_at_start = _device_used_mib() if cuda else None  # the CUDA context, before any tensor
    started = time.perf_counter()
    engine = ReferenceEngine.from_gguf(args.model, options)
    engine.sync()
    load_s = time.perf_counter() - started
    samples = measure_engine(engine, args.n_prompt, args.n_gen, args.repetitions,
                             random_tokens(engine.cfg.vocab, args.seed))
    x = torch.zeros(1, engine.cfg.hidden, dtype=engine.model.dtype, device=engine.model.device)
    return {
        "pp_samples": samples.pp, "tg_samples": samples.tg, "engine_s": samples.engine_s, "load_s": load_s,
        "device_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        # what the caching allocator held at most: NVML's peak above it is the CUDA context and kernels, not tensors
        "device_reserved_peak_mib": torch.cuda.max_memory_reserved() / 2**20 if cuda else None,
        # the device's memory in use at the start and the end, and the allocator's share at the end: what the end
        # holds beyond the start and the allocator is loaded kernels and local memory, which no torch counter sees
        "device_used_at_start_mib": used_at_start,
        "device_used_at_end_mib": _device_used_mib() if cuda else None,
        "device_reserved_at_end_mib": torch.cuda.memory_reserved() / 2**20 if cuda else None,
        # page-locked host memory torch's allocator holds, in its rounded blocks: the experts' copies (cache/pinned.py)
        "host_pinned_mib": torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) / 2**20 if cuda else None,
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "moe_impl": implementation(x, engine.experts.pool if hasattr(engine.experts, "pool")
                                   else engine.experts.banks[0]) if options.moe == "grouped" else options.moe,
        "weights": options.weights, "graphs": options.graphs,
        **engine.stats(),
    }


def _device_used_mib() -> float:
    """Memory in use on the device (every process's), as the driver reports it."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def reported(fn: Callable[[], T], user_error: int = EXIT_REJECTED) -> tuple[int, T | None]:
    """fn()'s value with status 0, or the exit status of what ended it, said in one line on stderr: a UserError
    `user_error`, running out of memory EXIT_OOM, torch missing EXIT_REJECTED. The worker's and generate's."""
    from autoinfer.errors import UserError

    try:
        import torch
    except ModuleNotFoundError:
        print("error: torch is not installed; pip install 'autoinfer[engine]'", file=sys.stderr)
        return EXIT_REJECTED, None
    try:
        return 0, fn()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return user_error, None
    except (torch.cuda.OutOfMemoryError, MemoryError) as exc:
        print(f"error: out of memory: {exc}", file=sys.stderr)
        return EXIT_OOM, None


def _read_config(model: str) -> None:
    from autoinfer.refengine.loader import read_config

    read_config(model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code, _ = reported(lambda: _read_config(args.model), EXIT_LOAD)
    if code:
        return code
    code, result = reported(lambda: measure(args))
    if code:
        return code
    print(json.dumps(result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
