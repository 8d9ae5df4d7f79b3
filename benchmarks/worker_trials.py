"""What the workers of a study did, trial by trial: which worker and GPU measured it, when, what it read.

    python3 benchmarks/worker_trials.py --study NAME --storage postgresql://…

Prints a markdown table and three checks: every trial's memory and energy were read on the GPU its worker was
given (CUDA_VISIBLE_DEVICES, an NVML index under CUDA_DEVICE_ORDER=PCI_BUS_ID), no two measurements overlapped in
time (the host lock), and the budget was run exactly once.
"""

from __future__ import annotations

import argparse
import statistics

import optuna

from autoinfer.campaign.spec import stored_campaign
from autoinfer.store import trials as store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--storage", required=True)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = store.load_study(args.study, args.storage)
    trials = [t for t in store.Store(study).records() if t.is_finished]
    t0 = min(t.env["started_at"] for t in trials)
    print("| trial | worker pid | CUDA_VISIBLE_DEVICES | GPU measured | peak MiB | energy J | tg tok/s | start s | "
          "end s | waited s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    windows, mismatched = [], []
    for t in sorted(trials, key=lambda t: t.env["started_at"]):
        host, env = t.host, t.env
        measured = [g["index"] for g in env["gpus"]]
        if measured != [int(i) for i in (host.cuda_visible_devices or "").split(",") if i]:
            mismatched.append(t.number)
        start = env["started_at"] - t0
        windows.append((start, start + env["duration_s"]))
        tg = t.samples("tg")
        energy = env["gpu"]["energy_j"] if env.get("gpu") else None
        print(f"| {t.number} | {host.pid} | {host.cuda_visible_devices} | {measured} | "
              f"{t.vram_peak_mib or 0:.0f} | {energy or 0:.1f} | "
              f"{statistics.median(tg) if tg else float('nan'):.1f} | {start:.1f} | {windows[-1][1]:.1f} | "
              f"{t.host_lock_wait_s or 0:.1f} |")
    windows.sort()
    overlaps = sum(1 for a, b in zip(windows, windows[1:]) if b[0] < a[1])
    print(f"\nfinished trials: {len(trials)} of budget {stored_campaign(study).budget.trials}; "
          f"workers: {len({t.host.pid for t in trials})}")
    print(f"trials measured on another GPU than their worker's: {mismatched or 'none'}")
    print(f"overlapping measurements: {overlaps}")


if __name__ == "__main__":
    main()
