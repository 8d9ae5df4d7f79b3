"""What the confirmation's test alone changes: the confirmations of saved real sweeps (benchmarks/real_sweeps.py) decided
again with each test on the same runs, each pick judged by the run's truth rounds. Comparing whole sweeps of two
variants also carries the searches' own divergence (a re-measurement on a host is a new process, so two sweeps of one
seed measure different configurations); this holds the runs fixed.

    python benchmarks/confirm_tests.py --sweeps /tmp/real-sweeps-XXXX --run results/real-sweeps-cpu-small-paired.json \
        --out results/real-sweeps-cpu-small-tests.json   # from the study databases real_sweeps.py left there
    python benchmarks/confirm_tests.py --judge results/real-sweeps-cpu-small-tests.json   # from the saved runs alone

--sweeps reads every study database in the folder (real_sweeps.py's scratch folder, printed in its log) and keeps
each confirmation's runs, finalists and settings in --out beside the truth of --run, so --judge needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
from real_sweeps import GRID, _key

TESTS = ("mannwhitney", "paired")


def extract(folder: Path) -> list[dict]:
    """Each database's stored confirmation: its runs (trial, round, score), finalists (trial, the grid's knobs,
    memory) and settings."""
    import optuna

    from autoinfer.store.trials import Store

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = []
    for db in sorted(folder.glob("*.db")):
        storage = f"sqlite:///{db}"
        study = optuna.load_study(study_name=optuna.get_all_study_summaries(storage)[0].study_name, storage=storage)
        store = Store(study)
        c = store.study_record().confirmed
        if c is None:
            continue
        out.append({"sweep": db.stem, "alpha": c.alpha, "memory_tolerance": c.memory_tolerance,
                    "speed_tolerance": c.speed_tolerance,
                    "finalists": [{"trial": f.trial, "memory_mib": f.memory_mib,
                                   "params": {k: store.record(f.trial).params[k] for k in GRID}}
                                  for f in c.finalists],
                    "runs": [{"trial": r.trial, "round": r.round, "score": r.score} for r in c.runs]})
    return out


def judge(confirmations: list[dict], truth_rows: list[dict]) -> dict:
    """Each confirmation decided by every test in TESTS; a pick's worth is its configuration's median over the truth
    rounds over the best one's."""
    from autoinfer.sweep.confirm import decide

    samples: dict[tuple[str, ...], list[float]] = {}
    for row in truth_rows:
        if row["outcome"] == "ok":
            samples.setdefault(_key(row), []).append(row["tg"])
    truth = {k: statistics.median(v) for k, v in samples.items()}
    best = max(truth.values())
    sweeps = []
    for c in confirmations:
        ok = [r for r in c["runs"] if r["score"] is not None]
        keys = [f["trial"] for f in c["finalists"]]
        scores = {k: [r["score"] for r in ok if r["trial"] == k] for k in keys}
        rounds = {k: [r["round"] for r in ok if r["trial"] == k] for k in keys}
        memory = {f["trial"]: f["memory_mib"] if f["memory_mib"] is not None else math.inf for f in c["finalists"]}
        params = {f["trial"]: f["params"] for f in c["finalists"]}
        worth = {}
        for test in TESTS:
            verdict = decide(scores, memory, alpha=c["alpha"], test=test, memory_tolerance=c["memory_tolerance"],
                             speed_tolerance=c["speed_tolerance"], score_rounds=rounds)
            pick = verdict.recommended
            worth[test] = None if pick is None else truth.get(_key(params[pick]), math.nan) / best
        sweeps.append({"sweep": c["sweep"], "rounds": max((r["round"] for r in c["runs"]), default=-1) + 1,
                       "worth": worth})
    pairs = [s["worth"] for s in sweeps if all(s["worth"][t] is not None and not math.isnan(s["worth"][t])
                                               for t in TESTS)]
    ratio = np.array([w["paired"] / w["mannwhitney"] for w in pairs])
    return {"sweeps": sweeps, "judged": len(pairs), "picks_differ": int((np.abs(ratio - 1) > 1e-12).sum()),
            "paired_better": int((ratio > 1.005).sum()), "paired_worse": int((ratio < 0.995).sum()),
            "geomean_paired_over_mannwhitney": float(np.exp(np.log(ratio).mean())) if len(ratio) else None,
            "worth_median": {t: statistics.median(w[t] for w in pairs) for t in TESTS} if pairs else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=Path, help="real_sweeps.py's scratch folder of study databases")
    ap.add_argument("--run", type=Path, help="real_sweeps.py's --out of the same run (its truth rounds)")
    ap.add_argument("--out", type=Path, help="JSON: the confirmations' runs, the truth, the judgement")
    ap.add_argument("--judge", type=Path, help="judge a saved --out file again; nothing else is read")
    args = ap.parse_args(argv)
    try:
        if args.judge:
            saved = json.loads(args.judge.read_text())
            confirmations, truth = saved["confirmations"], saved["truth"]
        elif args.sweeps and args.run and args.out:
            confirmations = extract(args.sweeps)
            truth = json.loads(args.run.read_text())["truth"]
        else:
            print("error: give --sweeps DIR --run FILE --out FILE, or --judge FILE", file=sys.stderr)
            return 2
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        print(f"error: {type(e).__name__}: {e}; name real_sweeps.py's folder and --out file, or a file this script "
              "wrote", file=sys.stderr)
        return 2
    if not confirmations:
        print("error: no confirmation found; run real_sweeps.py with --confirm", file=sys.stderr)
        return 2
    result = judge(confirmations, truth)
    if not args.judge:
        args.out.write_text(json.dumps({"judgement": result, "confirmations": confirmations, "truth": truth},
                                       indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sweeps"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
