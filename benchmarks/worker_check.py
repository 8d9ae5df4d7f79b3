"""Workers on a real machine: per-GPU workers, the host lock and the hardware class, read back from the study.

    python3 benchmarks/worker_check.py --model synth:tiny --gpus none --trials 4                      # CPU
    python3 benchmarks/worker_check.py --model /tmp/autoinfer-models/qwen35moe-35b-a3b-Q4_K.gguf \\
        --gpus 0 --ngl 99 --ncmoe 20,30 --trials 4 --out results/worker-check-h100.json              # CUDA

It writes a small llama-bench campaign, runs it through `autoinfer worker` (per GPU with --gpus, else one worker;
several with --workers N on a PostgreSQL --storage), then prints and saves what every trial recorded: which host,
hardware class and GPU measured it, its device-memory peak (a GPU worker must record one), how long it waited for
the host lock, and the trials' time line (measurements of one host must not overlap unless allowed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from autoinfer.coordination import hardware
from autoinfer.store import trials as store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synth:tiny")
    ap.add_argument("--gpus", default="none", help="'none' (one plain worker), or GPU list for --gpus, e.g. 0 or 0,1")
    ap.add_argument("--workers", type=int, default=1, help="plain workers to start (PostgreSQL --storage for > 1)")
    ap.add_argument("--storage", default=None, help="default: a SQLite file in a temporary folder")
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--ncmoe", default="0", help="n_cpu_moe values, comma-separated")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="worker-check-"))
    storage = args.storage or f"sqlite:///{work / 'study.db'}"
    campaign = work / "campaign.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "worker-check", "engine": "llama-bench", "model": args.model,
        "space": {"n_gpu_layers": args.ngl, "n_cpu_moe": [int(v) for v in args.ncmoe.split(",")],
                  "flash_attn": "on", "ubatch": [256, 512]},
        "budget": {"trials": args.trials}, "measure": {"n_prompt": 128, "n_gen": 32, "repetitions": 3},
        "search": {"informed": False}, "drift": {"every": None}, "confirm": {"enabled": False},
    }))
    study_name = f"worker-check-{int(time.time())}"
    cli = [sys.executable, "-c", "from autoinfer.cli import main; main()", "worker", str(campaign),
           "--study", study_name, "--storage", storage, "--quiet"]
    started = time.monotonic()
    if args.gpus != "none":
        procs = [subprocess.Popen([*cli, "--gpus", args.gpus])]
    else:
        procs = [subprocess.Popen(cli) for _ in range(args.workers)]
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - started

    study = store.load_study(study_name, storage)
    rows = []
    for t in store.Store(study).records():
        env = t.env
        rows.append({
            "trial": t.number, "state": t.state.name, "outcome": t.outcome,
            "host": asdict(t.host) if t.host else None, "vram_peak_mib": t.vram_peak_mib,
            "host_lock_wait_s": t.host_lock_wait_s,
            "tg_median": statistics.median(t.samples("tg")) if t.samples("tg") else None,
            "measured_from": env.get("started_at"),
            "measured_s": env.get("duration_s"),
            "gpu": (env.get("gpu") or {}).get("index"),
        })
    windows = sorted((r["measured_from"], r["measured_from"] + r["measured_s"]) for r in rows
                     if r["measured_from"] is not None and r["measured_s"] is not None)
    overlaps = sum(1 for (_, end), (start, _) in zip(windows, windows[1:]) if start < end)
    stored = store.Store(study).study_record().hardware_class
    summary = {"exit_codes": codes, "wall_s": round(wall, 1), "storage": storage.split("@")[-1],
               "hardware_class": stored.digest if stored else None,
               "class": hardware.describe(stored.fields if stored else {}),
               "overlapping_measurements": overlaps, "trials": rows}
    for r in rows:
        print(f"trial {r['trial']:>2} {r['outcome']:<10} pid {(r['host'] or {}).get('pid')} "
              f"CUDA_VISIBLE_DEVICES={(r['host'] or {}).get('cuda_visible_devices')} gpu={r['gpu']} vram_peak={r['vram_peak_mib']} "
              f"lock_wait={r['host_lock_wait_s']} tg={r['tg_median']}")
    print(f"class {summary['hardware_class']}: {summary['class']}; {len(rows)} trials in {wall:.0f} s; "
          f"{overlaps} overlapping measurement(s); exit {codes}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1, default=str))
    gpu_seen = args.gpus != "none" and any(r["outcome"] == "ok" for r in rows)
    missing_vram = gpu_seen and not any(r["vram_peak_mib"] for r in rows if r["outcome"] == "ok")
    if missing_vram:
        print("error: GPU workers recorded no device-memory peak", file=sys.stderr)
    return 1 if any(codes) or missing_vram else 0


if __name__ == "__main__":
    sys.exit(main())
