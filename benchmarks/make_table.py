"""Measure a grid of configurations with a real engine and write a replay table (CSV + model shape JSON).

CPU (here):   python benchmarks/make_table.py --model synth:tiny --out benchmarks/tables/cpu-tiny.csv \
                  --grid threads=1,2 ubatch=32,64,128 flash_attn=on,off type_k=f16,q8_0 --fixed n_gpu_layers=0
GPU (H100):   python benchmarks/make_table.py --model synth:35b-a3b/Q4_K --out benchmarks/tables/h100-35b.csv \
                  --grid n_gpu_layers=99 placement=first,last,even cpu_expert_layers=0-40+5 ubatch=512,1024 \
                  --fixed flash_attn=on threads=16 --n-prompt 512 --n-gen 64 --max-minutes 7 --resume
              (run it again until it reports every row; --resume keeps the rows already measured)
2 GPUs:       python benchmarks/make_table.py --model synth:35b-a3b/Q4_K --out 2gpu.csv \
                  --grid split_mode=layer,row tensor_split=1/1,2/1 --fixed n_gpu_layers=99 flash_attn=on
              (with several GPUs visible, each row also has vram_gpu0_mib, vram_gpu1_mib, …: the peak per GPU)

Every row is one engine run (one process), in a shuffled order so drift does not line up with a parameter; the
table keeps each row's repetitions so replay can draw from its noise. With --processes K every configuration is run
in K processes, in K rounds of the grid, each in its own shuffled order, a row per process numbered in `process`:
replay then draws one of them per run and judges a configuration by their median (autoinfer/engines/replay.py), so
a process that ran fast or slow as a whole neither sets the target nor stays a configuration's only answer.

CPU, K=5:     python benchmarks/make_table.py --model synth:small/Q4_K --out benchmarks/tables/cpu-small-processes.csv \
                  --grid threads=1,2 ubatch=64,256 type_k=f16,q8_0 flash_attn=on,off repack=1,0 load_mode=mmap,none \
                  --fixed n_gpu_layers=0 batch=256 --n-prompt 256 --n-gen 128 --repetitions 3 --processes 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from autoinfer.engines import base
from autoinfer.engines.base import RunContext, TrialConfig
from autoinfer.engines.replay import shape_path
from autoinfer.measure.gpu import measured_gpus
from autoinfer.model.placement import realize
from autoinfer.model.resolve import resolve_model
from autoinfer.model.shape import shape_from_gguf


def parse_values(text: str) -> list:
    """'1,2,4' → [1, 2, 4]; '0-40+4' → 0, 4, …, 40; words stay words."""
    if "-" in text and "+" in text and "," not in text:
        span, step = text.split("+")
        low, high = span.split("-")
        return list(range(int(low), int(high) + 1, int(step)))
    out = []
    for v in text.split(","):
        try:
            out.append(int(v))
        except ValueError:
            out.append(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf or synth:PRESET[/QTYPE]")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--grid", nargs="+", required=True, help="name=v1,v2,… (searched columns)")
    ap.add_argument("--fixed", nargs="*", default=[], help="name=value for every row")
    ap.add_argument("--engine", default="llama-bench")
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--max-minutes", type=float, default=None, help="stop starting rows after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out and measure the rest")
    ap.add_argument("--processes", type=int, default=1,
                    help="processes per configuration, in as many rounds of the grid (a `process` column above 1)")
    args = ap.parse_args(argv)
    if args.processes < 1:
        ap.error("--processes must be at least 1")

    model = Path(resolve_model(args.model))
    shape = shape_from_gguf(model)
    grid = dict(item.split("=", 1) for item in args.grid)
    fixed = {k: parse_values(v)[0] for k, v in (item.split("=", 1) for item in args.fixed)}
    names = list(grid)
    grid_points = list(itertools.product(*(parse_values(grid[n]) for n in names)))
    points = []  # (configuration, process): the grid once per process, each round in its own order
    for process in range(args.processes):
        order = list(grid_points)
        random.Random(args.seed + process).shuffle(order)
        points += [(point, process) for point in order]
    numbered = args.processes > 1
    engine = base.create(args.engine)
    engine.check()
    gpus = measured_gpus()  # device memory is sampled on these GPUs; none on CPU-only machines
    scratch = Path(tempfile.mkdtemp(prefix="make-table-"))
    rows = pd.read_csv(args.out).to_dict("records") if args.resume and args.out.is_file() else []
    done = {(tuple(str(r.get(n)) for n in names), int(r.get("process", 0))) for r in rows}
    points = [(p, k) for p, k in points if (tuple(str(v) for v in p), k) not in done]
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, (point, process) in enumerate(points):
        if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
            print(f"stopping after {i} of {len(points)} rows: --max-minutes reached", file=sys.stderr)
            break
        params = {**fixed, **dict(zip(names, point)), "model": str(model), "n_prompt": args.n_prompt,
                  "n_gen": args.n_gen, "repetitions": args.repetitions}
        config = realize(TrialConfig.from_params(params), shape.n_layers)
        m = engine.run(config, RunContext(timeout_s=args.timeout, artifacts=scratch, gpus=gpus))
        row = {**dict(zip(names, point)), "tg": m.tg, "pp": m.pp, "vram_mib": m.vram_peak_mib,
               "rss_mib": m.rss_peak_mib, "tg_samples": " ".join(f"{v:.4g}" for v in m.tg_samples),
               "pp_samples": " ".join(f"{v:.4g}" for v in m.pp_samples), "outcome": m.outcome.value,
               "wall_s": round(m.wall_s, 2), **({"process": process} if numbered else {})}
        if len(gpus) > 1:
            row.update({f"vram_gpu{k}_mib": v for k, v in enumerate(m.vram_per_gpu_mib)})
        rows.append(row)
        which = f" process {process}" if numbered else ""
        print(f"[{i + 1}/{len(points)}] {dict(zip(names, point))}{which} {m.outcome.value} tg={m.tg} pp={m.pp} "
              f"vram={m.vram_per_gpu_mib or m.vram_peak_mib} rss={m.rss_peak_mib} {m.reason[:80]}", flush=True)
        pd.DataFrame(rows).dropna(axis=1, how="all").to_csv(args.out, index=False)  # keep what was measured if the run is cut short
    shape_path(args.out).write_text(shape.to_json())
    meta = {"model": model.name, "fixed": fixed, "n_prompt": args.n_prompt, "n_gen": args.n_gen,
            "repetitions": args.repetitions, "engine": args.engine, "rows": len(rows),
            **({"processes": args.processes} if numbered else {}),
            "minutes": round((time.monotonic() - started) / 60, 2)}
    args.out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
