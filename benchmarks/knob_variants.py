"""A configuration against its one-knob variants, interleaved in fresh llama-bench processes: is a llama.cpp knob
that the shipped campaigns leave at its default (the CPU thread pool's --poll, --prio, --cpu-strict, -C) worth
searching? On a hybrid GPU+CPU decode the host side reaches about 30% of its memory bandwidth
(benchmarks/results/vs-fit-h100.md); the thread pool's wake-ups between the GPU's and the CPU's parts of each layer
were one candidate for the rest (benchmarks/results/host-knobs-h200.md: --poll and --cpu-strict did not lift it).

    autoinfer export --study NAME --format json > answer.json
    python benchmarks/knob_variants.py answer.json --vary poll=0,100 --vary cpu_strict=1 --vary prio=2 --rounds 5
    python benchmarks/knob_variants.py benchmarks/results/vs-fit-h100-45f764b.json --budget 8192 --vary poll=100

Each round runs the configuration as given and every variant once, in an order rotated each round. Prints per
configuration the median tg and pp over the rounds (one score per process: the median of its repetitions), and each
variant's ratio to the configuration as given with a 95% bootstrap CI and the Mann-Whitney p, and by round (the
geometric mean of the rounds' ratios, its t interval and the paired t-test's p), where a drift that moves a whole
round cancels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from answer_config import load_answer

from autoinfer.engines import base
from autoinfer.engines.base import RunContext, TrialConfig
from autoinfer.engines.llama_common import bench_args, env_words
from autoinfer.measure.gpu import measured_gpus
from autoinfer.measure.stats import compare, compare_paired


def variants(config: TrialConfig, vary: list[str]) -> dict[str, TrialConfig]:
    """'as given' and one configuration per KNOB=VALUE in `vary` ('poll=0,100' → two)."""
    out = {"as given": config}
    for item in vary:
        knob, _, values = item.partition("=")
        if not values:
            raise ValueError(f"--vary {item!r}: write KNOB=V1,V2 (e.g. poll=0,100)")
        for value in values.split(","):
            parsed = int(value) if value.lstrip("-").isdigit() else value
            out[f"{knob}={value}"] = TrialConfig.from_params({**config.to_params(), knob: parsed})
    return out


def interleave(configs: dict[str, TrialConfig], rounds: int, timeout_s: float) -> dict[str, dict[str, list[float]]]:
    """One tg and pp score per configuration per round, each run a fresh process."""
    engine = base.create("llama-bench")
    gpus = measured_gpus()
    names = list(configs)
    out = {name: {"tg": [], "pp": []} for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            m = engine.run(configs[name], RunContext(timeout_s=timeout_s, artifacts=Path(tempfile.mkdtemp()),
                                                     gpus=gpus))
            if not m.ok:
                raise SystemExit(f"round {r + 1}: {name} failed: {m.reason}")
            out[name]["tg"].append(statistics.median(m.tg_samples))
            out[name]["pp"].append(statistics.median(m.pp_samples))
            print(f"round {r + 1}: {name}: tg {out[name]['tg'][-1]:.1f} pp {out[name]['pp'][-1]:.0f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answer", type=Path, help="`autoinfer export --format json`, or a vs_fit.py result")
    parser.add_argument("--budget", type=float, help="with a vs_fit.py result: which budget's answer (MiB)")
    parser.add_argument("--vary", action="append", required=True, help="KNOB=V1,V2: one variant per value")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: a ratio's CI needs two runs a side")
    try:
        configs = variants(load_answer(args.answer, args.budget), args.vary)
    except ValueError as exc:  # bad input: one line and exit 2, nothing measured
        print(f"knob_variants.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print("as given: " + " ".join([*env_words(configs["as given"]), "llama-bench", *bench_args(configs["as given"])]),
          flush=True)
    runs = interleave(configs, args.rounds, args.timeout_s)
    given = runs["as given"]
    print(f"\n{args.rounds} rounds, interleaved\n")
    print("| configuration | tg median | pp median | tg vs as given [95% CI] | pp vs as given [95% CI] "
          "| tg by round [95% CI] | pp by round [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        cells = []
        for way in (compare, compare_paired):
            for metric in ("tg", "pp"):
                if name == "as given":
                    cells.append("—")
                    continue
                c = way(run[metric], given[metric])
                cells.append(f"{c.ratio:.3f} [{c.ratio_ci[0]:.3f}, {c.ratio_ci[1]:.3f}] p={c.p_value:.3f}")
        print(f"| {name} | {statistics.median(run['tg']):.1f} | {statistics.median(run['pp']):.0f} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
