"""The reference engine at a serving context, from the files `gpu_evidence.sh refcontext` and an interleaved final
leave in one folder: where its device memory goes, and how fast it ran beside a llama.cpp configuration.

Reads `refcontext-<budget_mib>.json` (the worker's JSON line) with `refcontext-nvml-<budget_mib>.txt` (NVML's
memory.used every 100 ms) per budget, and, where present, `final-fit.jsonl` (llama-bench's JSON lines, one pp and one
tg line per round, in round order) with `final-ref-<round>.json` (the worker's line, one per round). Prints per
budget: tg and pp medians, torch's allocated and reserved peaks, the CUDA context (the device's use before any
tensor), what neither the context nor the allocator holds at the end (loaded kernels, library workspaces) and NVML's
peak; then the final's ratios, the reference engine over llama.cpp, as two samples of one score per run (the median
of its repetitions) and paired by round (`autoinfer.measure.stats`).

    python benchmarks/refcontext_report.py benchmarks/results/refcontext-h100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autoinfer.engines.llama_bench import kind_of, parse_records, samples_of
from autoinfer.measure.stats import Comparison, compare, compare_paired

KINDS = ("tg", "pp")


def budget_rows(folder: Path) -> list[str]:
    """One table row per `refcontext-<budget_mib>.json` in the folder, by budget."""
    rows = []
    for budget in sorted(int(p.stem.split("-")[1]) for p in folder.glob("refcontext-[0-9]*.json")):
        d = json.loads((folder / f"refcontext-{budget}.json").read_text())
        nvml = [int(x) for x in (folder / f"refcontext-nvml-{budget}.txt").read_text().split()]
        start, end = d["device_used_at_start_mib"], d["device_used_at_end_mib"]
        neither = end - start - d["device_reserved_at_end_mib"]
        rows.append(f"| {budget} | {statistics.median(d['tg_samples']):.1f} | {statistics.median(d['pp_samples']):.0f} "
                    f"| {d['device_peak_mib']:.0f} | {d['device_reserved_peak_mib']:.0f} | {start:.0f} | {neither:.0f} "
                    f"| {max(nvml)} ({max(nvml) - budget:+d}) | {d['experts']['hit_rate']:.0%} |")
    return rows


def final_scores(folder: Path) -> dict[str, dict[str, list[float]]]:
    """Per side and measure, one score per run (the median of its repetitions), in round order."""
    fit = parse_records((folder / "final-fit.jsonl").read_text())
    refs = sorted(folder.glob("final-ref-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    ref = [json.loads(p.read_text()) for p in refs]
    return {"llama.cpp": {k: [statistics.median(samples_of(r)[0]) for r in fit if kind_of(r) == k] for k in KINDS},
            "reference": {k: [statistics.median(r[f"{k}_samples"]) for r in ref] for k in KINDS}}


def ratio(c: Comparison) -> str:
    return f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}] ({c.test}, p={c.p_value:.4f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    final = args.folder / "final-fit.jsonl"
    try:
        rows = budget_rows(args.folder)
        scores = final_scores(args.folder) if final.exists() else None
    except (OSError, ValueError, KeyError, TypeError) as e:  # a missing file, a cut line, a CPU run's None fields
        print(f"error: cannot read the run in {args.folder} ({e.__class__.__name__}: {e}): run gpu_evidence.sh "
              "refcontext on a GPU with OUT set to it", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no refcontext-<budget_mib>.json in {args.folder}: run gpu_evidence.sh refcontext with OUT "
              "set to it", file=sys.stderr)
        return 2
    print("| budget_mib | tg | pp | torch peak | allocator reserved peak | CUDA context | neither | NVML peak "
          "(above budget_mib) | expert hit rate |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if scores is not None:
        ref, fit = scores["reference"], scores["llama.cpp"]
        if len(ref["tg"]) != len(fit["tg"]):
            print(f"error: {len(ref['tg'])} reference runs against {len(fit['tg'])} llama.cpp runs: a round is "
                  "missing a side", file=sys.stderr)
            return 2
        for measure in KINDS:
            print(f"{measure}: reference {[round(x, 1) for x in ref[measure]]}, llama.cpp "
                  f"{[round(x, 1) for x in fit[measure]]}")
            print(f"  ratio of medians {ratio(compare(ref[measure], fit[measure]))}; "
                  f"by round {ratio(compare_paired(ref[measure], fit[measure]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
