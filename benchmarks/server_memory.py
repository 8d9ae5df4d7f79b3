"""The recommended configuration's peak memory in llama-bench (what a sweep measures) and in llama-server (what it
prints), interleaved in fresh processes: the deployment check records the server's peak beside the sweep's and the
budget, and fails it over a VRAM budget because on an H100 the printed server stayed below llama-bench
(benchmarks/results/server-memory-h100.md; `benchmarks/gpu_evidence.sh servermem` runs this there). This compares
them, and the server left to its default slots (four in the pinned build, each holding a hybrid model's recurrent
state) against the printed one slot.

    autoinfer export --study vs-fit-8192 --format json > answer.json
    python benchmarks/server_memory.py answer.json --rounds 3
    python benchmarks/server_memory.py benchmarks/results/vs-fit-h100-45f764b.json --budget 8192

Peaks are VRAM on the GPUs this machine measures (CUDA_VISIBLE_DEVICES), else RSS. Prints a table: per program the
median peak and its range over the rounds, and its paired difference from llama-bench's.
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
from autoinfer.engines.llama_common import env_words, server_args
from autoinfer.measure.gpu import measured_gpus
from autoinfer.sweep.deploy import check_prompt, run_check


def peaks(config: TrialConfig, rounds: int, timeout_s: float) -> dict[str, list[float]]:
    """One peak per program per round, in the order llama-bench, the printed server, the server's default slots,
    rotated each round."""
    gpus = tuple(measured_gpus())
    bench = base.create("llama-bench")
    printed = [*env_words(config), str(bench.tools.tool("llama-server")), *server_args(config, bench.tools)]
    at = printed.index("-np")
    default_slots = printed[:at] + printed[at + 2:]

    def of_bench() -> float | None:
        m = bench.run(config, RunContext(timeout_s=timeout_s, artifacts=Path(tempfile.mkdtemp()), gpus=gpus))
        if not m.ok:
            raise SystemExit(f"llama-bench failed: {m.reason}")
        return m.vram_peak_mib if gpus else m.rss_peak_mib

    def of_server(command: list[str]) -> float | None:
        check = run_check(command, timeout_s, check_prompt(config), gpus=gpus)
        if not check.passed:
            raise SystemExit(f"llama-server failed: {check.reason}")
        return check.vram_peak_mib if gpus else check.rss_peak_mib

    programs = {"llama-bench": of_bench, "llama-server -np 1 (printed)": lambda: of_server(printed),
                "llama-server, default slots": lambda: of_server(default_slots)}
    out: dict[str, list[float]] = {name: [] for name in programs}
    names = list(programs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out[name].append(programs[name]())
            print(f"round {r + 1}: {name}: {out[name][-1]:.0f} MiB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answer", type=Path, help="`autoinfer export --format json` of the study to check, or a "
                        "vs_fit.py result")
    parser.add_argument("--budget", type=float, help="with a vs_fit.py result: which budget's answer (MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    try:
        config = load_answer(args.answer, args.budget)
    except ValueError as exc:  # bad input: one line and exit 2, nothing measured
        print(f"server_memory.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    side = "VRAM" if measured_gpus() else "RSS"
    results = peaks(config, args.rounds, args.timeout_s)
    bench = results["llama-bench"]
    print(f"| program | peak {side} MiB, median | min-max | minus llama-bench's, median of rounds |")
    print("|---|---|---|---|")
    for name, values in results.items():
        paired = statistics.median(v - b for v, b in zip(values, bench))
        print(f"| {name} | {statistics.median(values):.0f} | {min(values):.0f}-{max(values):.0f} | {paired:+.0f} |")


if __name__ == "__main__":
    main()
