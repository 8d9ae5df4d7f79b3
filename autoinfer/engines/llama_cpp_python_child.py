"""Child process of the llama-cpp-python engine: load one model with `llama_cpp.Llama(**kwargs)`, time it, print JSON.

Runs in its own process so a crash or an out-of-memory kill ends only this trial. The method follows llama-bench:
one warm-up (prompt + one token), then per repetition a prompt of `n_prompt` random tokens decoded in `n_batch`
chunks and, from an empty cache, `n_gen` single-token decodes; times come from llama.cpp's own counters
(llama_perf_context: t_p_eval_ms/n_p_eval for batches, t_eval_ms/n_eval for single tokens).

Usage: python -m autoinfer.engines.llama_cpp_python_child '{"kwargs": {...}, "n_prompt": 64, ...}'
       python -m autoinfer.engines.llama_cpp_python_child --probe
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any


def _decode(llama_cpp: Any, ctx: Any, tokens: list[int], n_batch: int) -> None:
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start:start + n_batch]
        array = (llama_cpp.llama_token * len(chunk))(*chunk)
        status = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(array, len(chunk)))
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
    llama_cpp.llama_synchronize(ctx)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp

    if spec.get("repack") is not None:
        _set_repack(llama_cpp, bool(spec["repack"]))
    started = time.perf_counter()
    llm = llama_cpp.Llama(**spec["kwargs"])
    load_s = time.perf_counter() - started
    ctx, n_batch = llm.ctx, spec["kwargs"]["n_batch"]
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    memory = llama_cpp.llama_get_memory(ctx)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(n_vocab) for _ in range(n)]

    def perf() -> Any:
        return llama_cpp.llama_perf_context(ctx)

    _decode(llama_cpp, ctx, tokens(max(spec["n_prompt"], 2)), n_batch)  # warm-up
    _decode(llama_cpp, ctx, tokens(1), n_batch)
    pp: list[float] = []
    tg: list[float] = []
    raw: list[dict[str, float]] = []
    for _ in range(spec["repetitions"]):
        record: dict[str, float] = {}
        if spec["n_prompt"] > 0:
            llama_cpp.llama_memory_clear(memory, True)
            llama_cpp.llama_perf_context_reset(ctx)
            _decode(llama_cpp, ctx, tokens(spec["n_prompt"]), n_batch)
            data = perf()
            record.update(t_p_eval_ms=data.t_p_eval_ms, n_p_eval=data.n_p_eval)
            pp.append(1000.0 * data.n_p_eval / data.t_p_eval_ms)
        if spec["n_gen"] > 0:
            llama_cpp.llama_memory_clear(memory, True)
            llama_cpp.llama_perf_context_reset(ctx)
            for token in tokens(spec["n_gen"]):
                _decode(llama_cpp, ctx, [token], n_batch)
            data = perf()
            record.update(t_eval_ms=data.t_eval_ms, n_eval=data.n_eval)
            tg.append(1000.0 * data.n_eval / data.t_eval_ms)
        raw.append(record)
    return {"pp": pp, "tg": tg, "load_s": load_s, "perf": raw, "version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "library": _library_path(llama_cpp)}


def _set_repack(llama_cpp: Any, on: bool) -> None:
    """Llama() has no argument for weight repacking (llama_model_params.use_extra_bufts) and ignores unknown ones;
    it starts its model parameters from llama_model_default_params(), so the field is set there."""
    bindings = llama_cpp.llama_cpp
    defaults = bindings.llama_model_default_params

    def with_repack() -> Any:
        params = defaults()
        params.use_extra_bufts = on
        return params

    bindings.llama_model_default_params = with_repack


def _library_path(llama_cpp: Any) -> str:
    """The libllama this process loaded (from the package, or LLAMA_CPP_LIB_PATH)."""
    handle = llama_cpp.llama_cpp._lib
    return str(getattr(handle, "_name", handle))


def probe() -> dict[str, Any]:
    import llama_cpp

    return {"version": llama_cpp.__version__, "library": _library_path(llama_cpp),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def main(argv: list[str]) -> int:
    result = probe() if argv[1:] == ["--probe"] else measure(json.loads(argv[1]))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
