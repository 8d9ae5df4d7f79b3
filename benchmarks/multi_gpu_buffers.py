"""Per-GPU memory on a multi-GPU host: the peaks autoinfer measures next to the buffers llama.cpp says it made.

    python benchmarks/multi_gpu_buffers.py --model synth:small --config split_mode=layer,tensor_split=1/1 \
        --config split_mode=layer,tensor_split=1/1,expert_split=0/1

Each configuration is one llama-bench run with -v (so llama.cpp logs its model, KV and compute buffers per device),
sampled on every visible GPU as a trial is. A measured peak far from the logged buffers plus the CUDA context means
the per-GPU measurement (or the placement) is wrong.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

from autoinfer.engines.base import TrialConfig
from autoinfer.engines.llama_common import bench_args
from autoinfer.llama.build import find_tools
from autoinfer.measure.gpu import measured_gpus
from autoinfer.measure.process import run_isolated
from autoinfer.model.placement import realize
from autoinfer.model.resolve import resolve_model
from autoinfer.model.shape import shape_from_gguf

BUFFER = re.compile(r"(CUDA\d+|CPU\w*) (model|KV|compute|RS) buffer size =\s*([\d.]+) MiB")


def logged_buffers(stderr: str) -> dict[str, dict[str, float]]:
    """device → kind → MiB, from llama.cpp's load log (the last value of each, as a context may be re-made)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for device, kind, mib in BUFFER.findall(stderr):
        out[device][kind] = float(mib)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf or synth:PRESET[/QTYPE]")
    ap.add_argument("--config", action="append", required=True, help="name=value,… (one run each)")
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=16)
    args = ap.parse_args(argv)

    model = Path(resolve_model(args.model))
    n_layers = shape_from_gguf(model).n_layers
    tools = find_tools()
    gpus = measured_gpus()
    print("| configuration | outcome | measured peak per GPU (MiB) | llama.cpp buffers per device (MiB) |")
    print("|---|---|---|---|")
    for text in args.config:
        knobs = dict(item.split("=", 1) for item in text.split(","))
        config = realize(TrialConfig.from_params({"model": str(model), "n_gpu_layers": 99, "n_prompt": args.n_prompt,
                                                  "n_gen": args.n_gen, "repetitions": 1, **knobs}), n_layers)
        argv_ = [str(tools.tool("llama-bench")), *bench_args(config, tools), "-v"]
        res = run_isolated(argv_, timeout_s=600, gpus=gpus)
        buffers = logged_buffers(res.stderr)
        logged = "; ".join(f"{dev}: " + " ".join(f"{k} {v:.0f}" for k, v in kinds.items())
                           for dev, kinds in sorted(buffers.items()))
        outcome = "ok" if res.returncode == 0 else f"exit {res.returncode}: " + (res.stderr.strip().splitlines()
                                                                                 or ["?"])[-1][:120]
        peaks = " / ".join(f"{v:.0f}" for v in res.vram_per_gpu_mib)
        print(f"| {text} | {outcome} | {peaks} | {logged} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
