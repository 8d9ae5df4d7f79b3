"""Host buffers for the weights llama.cpp keeps in RAM, interleaved in fresh llama-bench processes: pinned (`-lm none`,
a CUDA build's default host buffer), pageable (`--no-host`), pageable on transparent huge pages (`--no-host` with
glibc's tunable: huge_pages=1, engines.llama_common.HUGE_PAGES), and the file's own pages (`-lm mmap`). Each process's
peak AnonHugePages and FilePmdMapped (smaps_rollup) say which of them got huge pages.

    python benchmarks/huge_pages.py --llama-bin BIN --model qwen35moe-35b-a3b-Q4_K.gguf --rounds 5 --out runs.jsonl
    python benchmarks/huge_pages.py --summary runs.jsonl [more.jsonl ...]

Each round runs every variant once, in an order rotated each round; one line per process goes to --out as it ends
(with the command and environment it ran, so the file says what was measured), so a run cut short keeps its rounds.
The summary prints per variant the median tg and pp (one score per process: the median of its repetitions) and the
huge-page variant's ratio to each other with a 95% bootstrap CI and the Mann-Whitney p
(autoinfer.measure.stats.compare), and by round: the geometric mean of the rounds' ratios, where both ran, with its t
interval and the paired t-test's p (compare_paired), in which a drift that moves a whole round cancels.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from autoinfer.engines.llama_common import HUGE_PAGES
from autoinfer.measure.stats import compare, compare_paired

VARIANTS = {"pinned": (["-lm", "none"], {}),
            "pageable": (["-lm", "none", "--no-host", "1"], {}),
            "huge pages": (["-lm", "none", "--no-host", "1"], HUGE_PAGES),
            "mmap": (["-lm", "mmap"], {})}
SMAPS = ("AnonHugePages", "FilePmdMapped", "Rss")


def run_one(argv: list[str], env: dict[str, str]) -> dict:
    """One llama-bench process: its JSON lines, exit status, wall time and smaps peaks (KiB)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = dict.fromkeys(SMAPS, 0)
    while proc.poll() is None:
        try:
            text = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
        except OSError:
            text = ""
        for key in SMAPS:
            found = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
            if found:
                peak[key] = max(peak[key], int(found.group(1)))
        time.sleep(0.5)
    out, err = proc.communicate()
    tests = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"rc": proc.returncode, "wall_s": round(time.monotonic() - started, 1), "peak_kib": peak,
            "tests": [{k: t.get(k) for k in ("n_prompt", "n_gen", "avg_ts", "samples_ts", "no_host", "load_mode")}
                      for t in tests], **({"stderr": err[-1500:]} if proc.returncode else {})}


def measure(args: argparse.Namespace) -> None:
    base = [str(Path(args.llama_bin) / "llama-bench"), "-m", str(args.model), "-ngl", "99", "-ncmoe",
            str(args.ncmoe), "-t", str(args.threads), "-fa", "on", "-ub", "256", "-b", "512", "-p", "512", "-n", "64",
            "-r", "3", "-o", "jsonl"]
    names = list(VARIANTS)
    deadline = time.monotonic() + args.max_seconds
    with open(args.out, "a") as log:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if time.monotonic() > deadline:
                    print("time limit: stopped", flush=True)
                    return
                flags, env = VARIANTS[name]
                argv = base + flags
                record = {"round": r, "variant": name, "argv": argv, "env": env, **run_one(argv, env)}
                log.write(json.dumps(record) + "\n")
                log.flush()
                print(r, name, record["rc"], record["wall_s"], record["peak_kib"], flush=True)


def summary(paths: list[Path]) -> None:
    # variant → kind → (file, run in it, round) → score: --out appends, and each run counts its rounds from 0
    by_round: dict[str, dict[str, dict[tuple[str, int, int], float]]] = {}
    huge: dict[str, list[float]] = {}
    for path in paths:
        run, last = 0, -1
        for line in path.read_text().splitlines():
            record = json.loads(line)
            run, last = run + (record["round"] < last), record["round"]
            if record["rc"]:
                continue
            name = record["variant"]
            for test in record["tests"]:
                kind = "pp" if test["n_prompt"] else "tg"
                by_round.setdefault(name, {"tg": {}, "pp": {}})[kind][(str(path), run, record["round"])] = (
                    statistics.median(test["samples_ts"]))
            huge.setdefault(name, []).append(record["peak_kib"]["AnonHugePages"] / 2 ** 20)
    scores = {name: {kind: list(s.values()) for kind, s in kinds.items()} for name, kinds in by_round.items()}
    print("| host buffer | processes | tg median [range] | pp median | AnonHugePages GiB (median) |")
    print("|---|---|---|---|---|")
    for name, s in scores.items():
        print(f"| {name} | {len(s['tg'])} | {statistics.median(s['tg']):.1f} [{min(s['tg']):.1f}, {max(s['tg']):.1f}] "
              f"| {statistics.median(s['pp']):.0f} | {statistics.median(huge[name]):.1f} |")
    if min((len(s["tg"]) for s in scores.values()), default=0) < 2 or "huge pages" not in scores:
        print("\nno ratios: they need 2 or more successful processes of every variant, huge pages among them")
        return
    print("\n| huge pages against | tg ratio [95% CI] | pp ratio [95% CI] | tg by round [95% CI] | pp by round [95% CI] |")
    print("|---|---|---|---|---|")
    for name in (n for n in scores if n != "huge pages"):
        cells = []
        for kind in ("tg", "pp"):
            c = compare(scores["huge pages"][kind], scores[name][kind])
            cells.append(f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}] p={c.p_value:.4f}")
        for kind in ("tg", "pp"):
            mine, theirs = by_round["huge pages"][kind], by_round[name][kind]
            both = sorted(set(mine) & set(theirs))
            if len(both) < 2:
                cells.append(f"{len(both)} round(s) with both")
                continue
            c = compare_paired([mine[k] for k in both], [theirs[k] for k in both])
            cells.append(f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}] p={c.p_value:.4f}")
        print(f"| {name} | {' | '.join(cells)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", help="a CUDA llama.cpp bin folder")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--ncmoe", type=int, default=27, help="layers whose experts stay in RAM (27: the 8 GiB answer)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=1e9, help="start no process after this long")
    ap.add_argument("--out", type=Path, help="JSON lines, appended")
    ap.add_argument("--summary", type=Path, nargs="+", help="print the tables of these JSON-lines files")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
    elif args.llama_bin and args.model and args.out:
        measure(args)
    else:
        ap.error("give --llama-bin, --model and --out to measure, or --summary FILES")


if __name__ == "__main__":
    main()
