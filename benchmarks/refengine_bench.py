"""Reference engine vs llama-bench on the same GGUF: op variants, whole-engine prefill/decode, bandwidth floors.

Run on a GPU machine (one model per invocation keeps each under a few minutes):
    autoinfer model synth /tmp/small.gguf --preset small --qtype Q8_0
    python benchmarks/refengine_bench.py --model /tmp/small.gguf --device cuda --dtype bf16 --out results/refengine
    autoinfer model synth /tmp/35b.gguf --preset 35b-a3b --qtype Q4_K       # 19.6 GB, the anchors' file
    python benchmarks/refengine_bench.py --model /tmp/35b.gguf --device cuda --dtype bf16 --out results/refengine
    python benchmarks/refengine_bench.py --model /tmp/35b.gguf --device cuda --dtype bf16 --budget-mib 16384 \
        --prefetch --skip-llama --out results/refengine
Writes <out>/<model>-<device>-<dtype>[-budget].md and .json: the `autoinfer engine bench` rows, then llama-bench's
pp/tg (all layers on the GPU, flash attention on) for the same file. Q8_0, Q4_0 and Q4_K files are dequantized on the
GPU while loading; bf16 weights of the 35B-A3B model take ~69 GB (all resident fits an 80 GB H100, barely).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import asdict
from pathlib import Path


def llama_bench(model: Path, n_prompt: int, n_gen: int, reps: int, llama_bin: Path | None, cuda: bool) -> dict:
    from autoinfer.engines.llama_bench import parse_records
    from autoinfer.llama.build import find_tools

    tools = find_tools(llama_bin, cuda=cuda or None)
    argv = [str(tools.tool("llama-bench")), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen),
            "-r", str(reps), "-ngl", "99" if cuda else "0", "-fa", "1", "-o", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"argv": argv, "error": proc.stderr[-2000:]}
    out = {"argv": argv, "commit": tools.commit}
    for rec in parse_records(proc.stdout):
        kind = "pp" if int(rec["n_gen"]) == 0 else "tg"
        out[kind] = {"avg_ts": rec["avg_ts"], "stddev_ts": rec["stddev_ts"], "samples_ts": rec.get("samples_ts")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--n-prompt", type=int, default=512)
    p.add_argument("--n-gen", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--budget-mib", type=float, default=None, help="device budget → expert cache slots")
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--prefill-chunk", type=int, default=64, help="tokens per prefill segment")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--llama-bin", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("results/refengine"))
    args = p.parse_args()

    import torch

    from autoinfer.refengine.bench import run_bench
    from autoinfer.refengine.engine import EngineOptions, slots_for_budget
    from autoinfer.refengine.loader import read_config

    cfg = read_config(args.model)
    slots = slots_for_budget(cfg, args.dtype, args.budget_mib) if args.budget_mib else 0
    options = EngineOptions(device=args.device, dtype=args.dtype, expert_slots=slots, prefetch=args.prefetch,
                            torch_threads=args.threads, prefill_chunk=args.prefill_chunk)
    bw, rows = run_bench(args.model, options, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.reps)
    result = {"model": str(args.model), "device": args.device, "dtype": args.dtype, "expert_slots": slots,
              "prefetch": args.prefetch, "bandwidth_gb_s": bw / 1e9, "rows": [asdict(r) for r in rows],
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "device_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None}
    if not args.skip_llama:
        result["llama_bench"] = llama_bench(args.model, args.n_prompt, args.n_gen, args.reps, args.llama_bin,
                                            args.device == "cuda")

    lines = [f"# {args.model.name} — reference engine on {result['device_name']} {args.dtype}",
             f"measured bandwidth {bw / 1e9:.0f} GB/s; expert slots {slots or 'all resident'}; "
             f"prefetch {args.prefetch}; peak device memory {result['device_peak_mib'] or 0:.0f} MiB", "",
             "| op | variant | rel. error vs ref | time ms | floor ms | floor/time | detail |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        err = "reference" if r.error is None else f"{r.error:.1e}"
        lines.append(f"| {r.what} | {r.variant} | {err} | {r.time_ms:.2f} | {r.floor_ms:.3f} | "
                     f"{r.floor_share:.1%} | {r.detail} |")
    lb = result.get("llama_bench")
    if lb:
        lines += ["", f"llama-bench ({' '.join(lb['argv'][1:])}):"]
        for kind in ("pp", "tg"):
            if kind in lb:
                lines.append(f"- {kind}: {lb[kind]['avg_ts']:.1f} ± {lb[kind]['stddev_ts']:.1f} tok/s")
        if "error" in lb:
            lines.append(f"- failed: {lb['error'].strip().splitlines()[-1] if lb['error'].strip() else '?'}")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.model.stem}-{args.device}-{args.dtype}" + (f"-{int(args.budget_mib)}mib" if args.budget_mib else "")
    (args.out / f"{stem}.md").write_text(text + "\n")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
