"""What the harness costs and whether it changes the numbers: harness trials vs plain llama-bench, interleaved.

For each configuration, `--pairs` times (order alternating: plain first, then harness first, …):
- plain:   the same llama-bench argv the engine builds, run with subprocess.run, JSON parsed;
- harness: one trial through the real code path (TrialGuard.measure: idle check, environment record, isolated
           child with memory sampling, statistics) on an in-memory Optuna study.
Printed per configuration (medians over the pairs):
- overhead  = harness trial wall time / plain llama-bench wall time          target <= 1.15
  (also shown without the idle check, which watches the CPU for a fixed 0.5 s before every trial)
- agreement = harness tg (pp) median / plain tg (pp) median                  target within ±3 %
- engine share = llama-bench's own timed work (samples_ns) / harness wall    (model load and warm-up are the rest)

CPU (tiny synthetic model, a minute or two):
    python benchmarks/overhead.py
GPU (35B-A3B-shaped synthetic model, CUDA build):
    python benchmarks/overhead.py --model MODEL.gguf --ngl 99 --ncmoe 0,30 --n-prompt 512 --n-gen 64 \
        --llama-bin BUILD/bin --threads 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.base import RunContext, TrialConfig, create
from autoinfer.engines.llama_bench import measurement_from_json
from autoinfer.store.trials import Store
from autoinfer.sweep.guard import TrialGuard

optuna.logging.set_verbosity(optuna.logging.WARNING)


def plain_run(argv: list[str], env: dict[str, str], config: TrialConfig) -> tuple[float, float | None, float | None]:
    """Wall time and tg/pp medians of a bare llama-bench invocation."""
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"plain llama-bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    m = measurement_from_json(proc.stdout, config)
    return wall, m.tg, m.pp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="GGUF file (default: the tiny synthetic model)")
    ap.add_argument("--llama-bin", type=Path, help="llama.cpp bin folder (default: find_tools lookup)")
    ap.add_argument("--ngl", type=int, default=0, help="-ngl for every configuration")
    ap.add_argument("--ncmoe", default="0", help="comma-separated -ncmoe values, one configuration each")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts, one configuration each")
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--out", type=Path, help="also write the raw numbers as JSON here")
    args = ap.parse_args()

    if args.model is None:
        from autoinfer.model.synth import cached_model

        args.model = cached_model("tiny", "Q8_0")
    engine = create("llama-bench", llama_bin=args.llama_bin)
    engine.check()
    env = dict(os.environ)
    if engine.tools.lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(engine.tools.lib_dir), env.get("LD_LIBRARY_PATH"))
                                                 if p)
    campaign = parse_campaign({
        "name": "overhead", "model": str(args.model), "idle": {"policy": "warn"},
        "measure": {"n_prompt": args.n_prompt, "n_gen": args.n_gen, "repetitions": args.repetitions,
                    "timeout_s": 600, "max_cv": None},
        "drift": {"every": None}, "confirm": {"enabled": False},
    })
    study = optuna.create_study(direction="maximize")
    guard = TrialGuard(study, campaign, engine, note=lambda text: print(f"  [{text}]", file=sys.stderr))
    configs = [TrialConfig(args.model, n_gpu_layers=args.ngl, n_cpu_moe=int(nc), threads=int(t),
                           n_prompt=args.n_prompt, n_gen=args.n_gen, repetitions=args.repetitions)
               for nc in args.ncmoe.split(",") for t in args.threads.split(",")]
    raw = []
    tmp = tempfile.mkdtemp(prefix="autoinfer-overhead-")  # trial artifacts; printed so they can be inspected
    print(f"harness trial artifacts under {tmp}", file=sys.stderr)
    for config in configs:
        argv = engine.command(config)
        rows = []
        for i in range(args.pairs):
            for side in (("plain", "harness") if i % 2 == 0 else ("harness", "plain")):
                if side == "plain":
                    wall, tg, pp = plain_run(argv, env, config)
                    rows.append({"pair": i, "side": side, "wall_s": wall, "tg": tg, "pp": pp})
                else:
                    trial = study.ask()
                    started = time.monotonic()
                    ctx = RunContext(timeout_s=600, artifacts=Path(tmp) / str(trial.number),
                                     gpus=guard.gpus)  # device memory sampled, as in a sweep
                    m = guard.measure(trial, config, lambda c=config, x=ctx: engine.run(c, x))
                    wall = time.monotonic() - started
                    study.tell(trial, m.tg or 0.0)
                    if not m.ok:
                        raise SystemExit(f"harness trial failed: {m.outcome.value}: {m.reason}")
                    idle_s = float(Store(study).record(trial.number).idle["waited_s"])
                    rows.append({"pair": i, "side": side, "wall_s": wall, "tg": m.tg, "pp": m.pp,
                                 "engine_s": m.engine_s, "process_wall_s": m.wall_s, "idle_s": idle_s,
                                 "wall_excl_idle_s": wall - idle_s,
                                 "tokens_per_joule": (m.env.get("gpu") or {}).get("tokens_per_joule")})
        raw.append({"ngl": config.n_gpu_layers, "ncmoe": config.n_cpu_moe, "threads": config.threads, "runs": rows})
    report(raw, args)
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "commit": engine.tools.commit,
                                        "cuda": engine.tools.cuda, "configs": raw}, indent=1))


def _median_ratio(runs: list[dict], key: str, plain_key: str | None = None) -> float | None:
    """Median over pairs of harness[key] / plain[plain_key or key]."""
    ratios = []
    for i in sorted({r["pair"] for r in runs}):
        h = next(r for r in runs if r["pair"] == i and r["side"] == "harness")
        p = next(r for r in runs if r["pair"] == i and r["side"] == "plain")
        if h[key] and p[plain_key or key]:
            ratios.append(h[key] / p[plain_key or key])
    return statistics.median(ratios) if ratios else None


def report(raw: list[dict], args: argparse.Namespace) -> None:
    print(f"\nmodel {args.model}  -p {args.n_prompt} -n {args.n_gen} -r {args.repetitions}, {args.pairs} pairs "
          "(medians over pairs)")
    head = ("ngl", "ncmoe", "t", "plain wall s", "harness wall s", "idle check s", "overhead",
            "overhead excl. idle check", "tg harness/plain", "pp harness/plain", "engine share", "tok/J (GPU)")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    ok = True
    for c in raw:
        runs = c["runs"]
        plain_wall = statistics.median(r["wall_s"] for r in runs if r["side"] == "plain")
        harness = [r for r in runs if r["side"] == "harness"]
        harness_wall = statistics.median(r["wall_s"] for r in harness)
        overhead = _median_ratio(runs, "wall_s")
        overhead_run = _median_ratio(runs, "wall_excl_idle_s", "wall_s")
        idle_s = statistics.median(r["idle_s"] for r in harness)
        tg, pp = _median_ratio(runs, "tg"), _median_ratio(runs, "pp")
        share = statistics.median((r["engine_s"] or 0.0) / r["wall_s"] for r in harness)
        tpj = [r["tokens_per_joule"] for r in harness if r["tokens_per_joule"]]
        ok &= overhead is not None and overhead <= 1.15
        ok &= all(x is None or abs(x - 1) <= 0.03 for x in (tg, pp))
        print(" | ".join([str(c["ngl"]), str(c["ncmoe"]), str(c["threads"]), f"{plain_wall:.2f}",
                          f"{harness_wall:.2f}", f"{idle_s:.2f}", fmt(overhead), fmt(overhead_run), fmt(tg),
                          fmt(pp), f"{share:.2f}", fmt(statistics.median(tpj)) if tpj else "—"]))
    print(f"\ntargets (overhead <= 1.15, agreement within ±3 %): {'met' if ok else 'MISSED'}")


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    main()
