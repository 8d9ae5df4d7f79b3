"""Cross-check of the three llama.cpp engines: one model, one configuration, llama-bench vs llama-server vs
llama-cpp-python, each in its own process, rounds interleaved so drift hits all three alike.

CPU (tiny model, one thread):   python benchmarks/engine_crosscheck.py
CUDA (35B-A3B stand-in on GPU):  python benchmarks/engine_crosscheck.py --preset 35b-a3b --qtype Q4_K \
                                     --n-gpu-layers 99 --threads 8 --n-prompt 512 --n-gen 128
Prints a markdown table (median and min–max of each engine's samples, ratio to llama-bench) and, with --out,
writes every sample as JSON. The weights are random: speed is real, output text is not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autoinfer.engines.base import RunContext, TrialConfig, create
from autoinfer.model.synth import cached_model

ENGINES = ("llama-bench", "llama-server", "llama-cpp-python")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--qtype", default="Q8_0")
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-prompt", type=int, default=64)
    parser.add_argument("--n-gen", type=int, default=16)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the three engines")
    parser.add_argument("--flash-attn", default="off", choices=("on", "off"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    started = time.monotonic()
    model = cached_model(args.preset, args.qtype, tokenizer="qwen35")  # llama-server needs real tokens
    synth_s = time.monotonic() - started
    config = TrialConfig(model, n_gpu_layers=args.n_gpu_layers, threads=args.threads, n_prompt=args.n_prompt,
                         n_gen=args.n_gen, repetitions=args.repetitions, flash_attn=args.flash_attn)
    engines = {name: create(name) for name in ENGINES}
    for engine in engines.values():
        engine.check()
    samples: dict[str, dict[str, list[float]]] = {n: {"pp": [], "tg": []} for n in ENGINES}
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for rnd in range(args.rounds):
            for name, engine in engines.items():
                m = engine.run(config, RunContext(timeout_s=args.timeout, artifacts=Path(scratch)))
                print(f"round {rnd} {name}: {m.outcome.value} {m.reason[:200]}", file=sys.stderr, flush=True)
                runs.append({"round": rnd, "engine": name, "outcome": m.outcome.value, "reason": m.reason,
                             "pp": list(m.pp_samples), "tg": list(m.tg_samples), "wall_s": m.wall_s,
                             "vram_peak_mib": m.vram_peak_mib, "rss_peak_mib": m.rss_peak_mib,
                             "metrics": m.metrics, "cmd": list(m.engine_cmd)})
                samples[name]["pp"] += m.pp_samples
                samples[name]["tg"] += m.tg_samples

    print(f"\n{args.preset} {args.qtype}, ngl {args.n_gpu_layers}, threads {args.threads}, pp{args.n_prompt} "
          f"tg{args.n_gen}, {args.rounds}×{args.repetitions} samples per engine (model ready in {synth_s:.0f} s)\n")
    print("| engine | pp tok/s median (min–max) | tg tok/s median (min–max) | pp / bench | tg / bench |")
    print("|---|---|---|---|---|")
    base = {k: statistics.median(samples["llama-bench"][k]) if samples["llama-bench"][k] else None
            for k in ("pp", "tg")}
    for name in ENGINES:
        cells = []
        ratios = []
        for kind in ("pp", "tg"):
            values = samples[name][kind]
            if not values:
                cells.append("—")
                ratios.append("—")
                continue
            med = statistics.median(values)
            cells.append(f"{med:.1f} ({min(values):.1f}–{max(values):.1f})")
            ratios.append(f"{med / base[kind]:.2f}" if base[kind] else "—")
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratios[0]} | {ratios[1]} |")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs},
                                       indent=1))
    failed = [r for r in runs if r["outcome"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
