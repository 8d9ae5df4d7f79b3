"""Judge the search by real sweeps on this host, where a replay table cannot: a re-measurement here is a new process.

Many short sweeps of cpu-small's space (benchmarks/tables/cpu-small.csv: the small synthetic model on the CPU, threads
× ubatch × K cache × flash attention × repacking × load mode), each with its own sampler seed, for one or more source
trees of autoinfer (`--variant NAME=PATH`, paired by seed, their order alternated), against the truth: every
configuration of the space measured in fresh processes (benchmarks/make_table.py rounds, interleaved with the
sweeps). What an answer is worth is its configuration's median over those rounds, over the best such median.

    python benchmarks/real_sweeps.py --seeds 60 --out real-sweeps.json                 # the search as it stands
    python benchmarks/real_sweeps.py --variant base=. --variant doubt=/tmp/wt-doubt --seeds 60 --out r.json
    python benchmarks/real_sweeps.py --variant base=. --confirm --seeds 20 --out r.json  # with the confirmation
    python benchmarks/real_sweeps.py --judge r.json                                       # judge a saved run again

A sweep takes ~20 s on a 2-core host (~60 s with --confirm), a truth round ~90 s. Run it on an otherwise idle host:
the point is the host's own process-to-process luck (benchmarks/results/cpu-small-threads.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import wilcoxon

from autoinfer.measure.stats import bootstrap_ci

HERE = Path(__file__).resolve().parent
GRID = {"threads": [1, 2], "ubatch": [64, 256], "type_k": ["f16", "q8_0"], "flash_attn": ["on", "off"],
        "repack": [1, 0], "load_mode": ["mmap", "none"]}
FIXED = {"n_gpu_layers": 0, "batch": 256}
N_PROMPT, N_GEN, REPETITIONS = 256, 128, 3


def _key(params: dict) -> tuple[str, ...]:
    return tuple(str(params[k]) for k in GRID)


def one_sweep(seed: int, db: Path, trials: int, confirm: bool) -> dict:
    """One sweep of the space in this process (the tree on PYTHONPATH); its recommendation."""
    from autoinfer.campaign.spec import parse_campaign
    from autoinfer.store.trials import Store
    from autoinfer.sweep.recommend import recommend
    from autoinfer.sweep.runner import sweep

    campaign = parse_campaign({
        "name": f"real-{seed}", "engine": "llama-bench", "model": "synth:small/Q4_K",
        "space": {**FIXED, **GRID}, "objective": "tg", "budget": {"trials": trials},
        "sampler": {"name": "tpe", "seed": seed},
        "measure": {"n_prompt": N_PROMPT, "n_gen": N_GEN, "repetitions": REPETITIONS, "timeout_s": 120,
                    "rerun_noisy": False},
        "idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"enabled": confirm},
    }, str(db.with_suffix(".yaml")))
    study = sweep(campaign, storage=f"sqlite:///{db}", progress=False).study
    rec = recommend(study)
    store = Store(study)
    records = store.records()
    params = store.record(rec.trial).params if rec else None
    confirmed = store.study_record().confirmed
    return {"seed": seed, "answer": {k: params[k] for k in GRID} if params else None,
            "claimed": rec.speed if rec else None, "confirmed": bool(rec and rec.confirmed),
            "confirm_rounds": confirmed.rounds if confirmed else None,
            "again": sum(r.again_of is not None for r in records),
            "measured": sum(not r.unmeasured for r in records)}


def truth_round(out: Path, seed: int) -> None:
    import make_table  # benchmarks/, beside this file
    make_table.main(["--model", "synth:small/Q4_K", "--out", str(out),
                     "--grid", *(f"{k}={','.join(map(str, v))}" for k, v in GRID.items()),
                     "--fixed", *(f"{k}={v}" for k, v in FIXED.items()), "--n-prompt", str(N_PROMPT),
                     "--n-gen", str(N_GEN), "--repetitions", str(REPETITIONS), "--seed", str(seed)])


def judge(sweeps: dict[str, list[dict]], rounds: list[pd.DataFrame]) -> dict:
    """Each answer's truth (its median over the rounds) over the best; variants compared seed by seed. A variant
    none of whose answers a round measured is reported with no worth, not raised: the run's sweeps are still saved."""
    samples: dict[tuple[str, ...], list[float]] = {}
    for frame in rounds:
        for row in frame[frame.outcome == "ok"].to_dict("records"):
            samples.setdefault(_key(row), []).append(row["tg"])
    truth = {k: statistics.median(v) for k, v in samples.items()}
    best = max(truth, key=truth.__getitem__)
    out: dict = {"rounds": len(rounds), "best": dict(zip(GRID, best)), "best_tg": truth[best], "variants": {}}
    worth = {}
    for name, runs in sweeps.items():
        judged = [r for r in runs if r["answer"] and _key(r["answer"]) in truth]  # no truth: failed in every round
        unjudged = sum(1 for r in runs if r["answer"]) - len(judged)
        if not judged:
            out["variants"][name] = {"sweeps": len(runs), "answers": 0, "unjudged": unjudged}
            continue
        w = {r["seed"]: truth[_key(r["answer"])] / truth[best] for r in judged}
        worth[name] = w
        claimed = [r["claimed"] / truth[_key(r["answer"])] for r in judged]
        out["variants"][name] = {
            "sweeps": len(runs), "answers": len(w), "unjudged": unjudged,
            "worth_median": statistics.median(w.values()),
            "worth_mean": statistics.mean(w.values()), "worth_worst": min(w.values()),
            "within_98": sum(v >= 0.98 for v in w.values()),
            "two_threads": sum(str(r["answer"]["threads"]) == "2" for r in judged),
            "again": sum(r["again"] for r in runs), "claimed_over_truth_median": statistics.median(claimed),
            "confirm_rounds": sum(r.get("confirm_rounds") or 0 for r in runs)}
    names = list(worth)
    for other in names[1:]:
        seeds = sorted(set(worth[names[0]]) & set(worth[other]))
        ratio = np.array([worth[other][s] / worth[names[0]][s] for s in seeds])
        log_ratio = np.log(ratio)
        ci = bootstrap_ci(log_ratio, stat=np.mean, n_resamples=10000) if len(ratio) > 1 else None
        diff = ratio - 1
        out[f"{other}/{names[0]}"] = {
            "seeds": len(seeds), "better": int((diff > 0.005).sum()), "worse": int((diff < -0.005).sum()),
            "geomean": float(np.exp(np.mean(log_ratio))), "ci95": [math.exp(x) for x in ci] if ci else None,
            "wilcoxon_p": float(wilcoxon(diff).pvalue) if (diff != 0).any() else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="NAME=PATH of an autoinfer source tree "
                    "(repeatable; default: this repository as 'search')")
    ap.add_argument("--seeds", type=int, default=20, help="sweeps per variant (sampler seeds 0…N-1)")
    ap.add_argument("--trials", type=int, default=12, help="each sweep's trial budget")
    ap.add_argument("--confirm", action="store_true", help="each sweep ends with its confirmation")
    ap.add_argument("--every", type=int, default=5, help="a truth round after this many seeds (and one first)")
    ap.add_argument("--out", type=Path, help="JSON: every sweep, the truth rounds, the judgement")
    ap.add_argument("--judge", type=Path, help="print the judgement of a saved --out file; nothing runs")
    ap.add_argument("--one", nargs=4, metavar=("SEED", "DB", "TRIALS", "CONFIRM"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        seed, db, trials, confirm = args.one
        print(json.dumps(one_sweep(int(seed), Path(db), int(trials), confirm == "1")))
        return 0
    if args.judge:
        try:
            saved = json.loads(args.judge.read_text())
            truth = pd.DataFrame(saved["truth"])
            print(json.dumps(judge(saved["sweeps"], [g for _, g in truth.groupby("round")]), indent=1))
        except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            print(f"error: --judge {args.judge}: not a saved run ({type(e).__name__}: {e}); name a file this script "
                  "wrote with --out", file=sys.stderr)
            return 2
        return 0
    if args.out is None:
        print("error: --out is required to run sweeps (or --judge FILE to judge a saved run)", file=sys.stderr)
        return 2
    for name, value in (("--seeds", args.seeds), ("--trials", args.trials), ("--every", args.every)):
        if value < 1:
            print(f"error: {name} {value}: give at least 1", file=sys.stderr)
            return 2
    if any("=" not in v for v in args.variant):
        print(f"error: --variant {next(v for v in args.variant if '=' not in v)}: give NAME=PATH", file=sys.stderr)
        return 2
    variants = dict(v.split("=", 1) for v in args.variant) or {"search": str(HERE.parent)}
    for name, tree in variants.items():
        if not (Path(tree) / "autoinfer").is_dir():
            print(f"error: --variant {name}={tree}: no autoinfer package there; name a source tree", file=sys.stderr)
            return 2
    scratch = Path(tempfile.mkdtemp(prefix="real-sweeps-"))
    sweeps: dict[str, list[dict]] = {name: [] for name in variants}
    rounds: list[pd.DataFrame] = []

    def measure_truth() -> None:
        path = scratch / f"round-{len(rounds)}.csv"
        truth_round(path, 100 + len(rounds))
        rounds.append(pd.read_csv(path))

    measure_truth()
    for seed in range(args.seeds):
        order = list(variants) if seed % 2 == 0 else list(reversed(variants))
        for name in order:
            db = scratch / f"{name}-{seed}.db"
            env = {**os.environ, "PYTHONPATH": str(Path(variants[name]).resolve())}
            done = subprocess.run([sys.executable, __file__, "--one", str(seed), str(db), str(args.trials),
                                   str(int(args.confirm))], env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"{name} seed {seed} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            sweeps[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{name} seed {seed}: {sweeps[name][-1]}", flush=True)
        if (seed + 1) % args.every == 0:
            measure_truth()
    result = judge(sweeps, rounds)
    args.out.write_text(json.dumps({"judgement": result, "sweeps": sweeps,
                                    "truth": pd.concat([r.assign(round=i) for i, r in enumerate(rounds)])
                                    .to_dict("records")}, indent=1, default=str) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
