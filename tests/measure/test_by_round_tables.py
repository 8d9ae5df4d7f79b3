"""The benchmarks that interleave configurations in rounds read their stored runs by round too (the geometric mean
of the rounds' ratios, autoinfer.measure.stats.compare_paired), from the files they keep: vs_fit.py's results
(benchmarks/vs_fit_rounds.py) and huge_pages.py's process lines (its --summary)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_vs_fit_rounds_table_reads_a_stored_run_by_round(monkeypatch, capsys):
    """Each stored budget's ratio of medians and its ratio by round, both from the runs the result file keeps; and
    the share of its bandwidth ceiling each side reached, from the account the file keeps."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit_rounds import main

    result = BENCHMARKS / "results" / "vs-fit-h100-f0898b6.json"
    assert main([str(result)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.split("## Single-GPU runs pooled")[0].splitlines()
            if line.startswith(f"| {result.name} ")]
    records = json.loads(result.read_text())
    assert len(rows) == len(records)
    for row, record in zip(rows, records):
        cells = _cells(row)
        ours, fit = np.array(record["runs"]["ours"]["tg"]), np.array(record["runs"]["fit"]["tg"])
        assert cells[1] == f"{record['budget_mib']:.0f}"
        assert cells[4].startswith(f"{np.median(ours) / np.median(fit):.2f} [")
        assert cells[5].startswith(f"{np.exp(np.mean(np.log(ours / fit))):.2f} [")
    ceilings = out.split("## Bandwidth ceilings")[1]
    for record in records:  # each side's median over the ceiling its placement's bytes allow
        cells = _cells(next(line for line in ceilings.splitlines()
                            if line.startswith(f"| {result.name} | {record['budget_mib']:.0f} |")))
        for side, cell in (("fit", cells[4]), ("ours", cells[5])):
            ceiling = record["bandwidth"][side]["tg_ceiling"]
            reached = np.median(record["runs"][side]["tg"]) / ceiling
            assert cell == f"{ceiling:.1f} ({reached:.0%})"


def test_the_vs_fit_rounds_table_pools_the_single_gpu_runs(monkeypatch, capsys, tmp_path):
    """Each single-GPU run's ratio by round is one observation of the pooled row; a run on two GPUs (fit split the
    tensors) stays out of it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit_rounds import main

    def record(budget: float, ours: list[float], split: str | None) -> dict:
        fit = [100.0, 104.0, 98.0]
        side = {"pp": [500.0, 510.0, 490.0], "peak": [budget - 100] * 3}
        return {"budget_mib": budget, "fit": {"tensor_split": split},
                "runs": {"ours": {"tg": ours, **side}, "fit": {"tg": fit, **side}}}

    ours = {8192.0: [110.0, 112.0, 109.0], 12288.0: [99.0, 106.0, 97.0], 16384.0: [90.0, 95.0, 92.0]}
    path = tmp_path / "vs-fit-test.json"
    path.write_text(json.dumps([record(b, tg, None) for b, tg in ours.items()]
                               + [record(6144.0, [150.0, 160.0, 155.0], "12/29")]))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    by_run = [np.exp(np.mean(np.log(np.array(tg) / np.array([100.0, 104.0, 98.0])))) for tg in ours.values()]
    pooled = _cells(next(line for line in out.splitlines() if line.startswith("| all | ")))
    assert pooled[1] == "3"
    assert pooled[2].startswith(f"{np.exp(np.mean(np.log(by_run))):.3f} [")
    assert (pooled[3], pooled[4]) == (f"{min(by_run):.2f}", f"{max(by_run):.2f}")
    assert (pooled[5], pooled[6]) == ("1", "1")  # 8 GiB ran faster than fit every round, 16 GiB slower
    assert not any(line.startswith("| 6144 | ") for line in out.split("## Single-GPU runs pooled")[1].splitlines())


def test_a_run_at_a_serving_context_is_pooled_apart_and_its_peaks_count_the_context(monkeypatch, capsys, tmp_path):
    """vs_fit.py --context holds each side's llama-bench peak with the KV cache of the serving context on top: the
    table's peaks say so, and its pooled row is its own budget-and-context row (and part of `all`)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit_rounds import main

    side = {"pp": [500.0, 510.0, 490.0], "peak": [7300.0, 7350.0, 7320.0]}
    runs = {"ours": {"tg": [105.0, 106.0, 104.0], **side}, "fit": {"tg": [100.0, 101.0, 99.0], **side}}
    plain = {"budget_mib": 8192.0, "fit": {}, "runs": runs}
    served = {**plain, "serve_context": 32768, "context_mib": {"ours": 348.0, "fit": 656.0}}
    path = tmp_path / "vs-fit-test.json"
    path.write_text(json.dumps([plain, served]))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    rows = [_cells(line) for line in out.split("## Single-GPU runs pooled")[0].splitlines()
            if line.startswith(f"| {path.name} ")]
    assert [(r[-2], r[-1]) for r in rows] == [("7350", "7350"), (f"{7350 + 656:.0f}", f"{7350 + 348:.0f}")]
    pooled = out.split("## Single-GPU runs pooled")[1]
    assert _cells(next(line for line in pooled.splitlines() if line.startswith("| 8192 | ")))[1] == "1"
    assert _cells(next(line for line in pooled.splitlines()
                       if line.startswith("| 8192, serving 32768 tokens | ")))[1] == "1"
    assert _cells(next(line for line in pooled.splitlines() if line.startswith("| all | ")))[1] == "2"


def test_the_huge_pages_summary_pairs_the_variants_by_round(monkeypatch, capsys, tmp_path):
    """A round where one variant failed leaves that round out of the pairs; the ratio by round is the geometric mean
    of the rounds where both ran."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["huge_pages.py", "--summary", str(tmp_path / "runs.jsonl")])
    from huge_pages import main

    tg = {"huge pages": [100.0, 110.0, 120.0, 90.0], "mmap": [90.0, 100.0, 100.0, 80.0]}
    lines = []
    for r in range(4):
        for variant, values in tg.items():
            failed = variant == "mmap" and r == 3
            tests = [{"n_prompt": 512, "n_gen": 0, "samples_ts": [500.0 + r]},
                     {"n_prompt": 0, "n_gen": 64, "samples_ts": [values[r]]}]
            lines.append(json.dumps({"round": r, "variant": variant, "rc": 1 if failed else 0, "tests": tests,
                                     "peak_kib": {"AnonHugePages": 0}}))
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    main()
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mmap | ")][-1]  # ratios
    cells = _cells(row)
    assert cells[1].startswith(f"{statistics.median(tg['huge pages']) / statistics.median(tg['mmap'][:3]):.2f} [")
    by_round = np.exp(np.mean(np.log(np.array(tg["huge pages"][:3]) / np.array(tg["mmap"][:3]))))
    assert cells[3].startswith(f"{by_round:.2f} [")
    assert cells[4].startswith("1.00 [")  # the prompts ran alike round by round


def test_the_huge_pages_summary_pairs_rounds_within_each_appended_run(monkeypatch, capsys, tmp_path):
    """--out appends, and each run counts its rounds from 0: round 0 of the second run is paired with its own round
    0, not with the first run's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["huge_pages.py", "--summary", str(tmp_path / "runs.jsonl")])
    from huge_pages import main

    runs = [{"huge pages": [100.0, 102.0], "mmap": [50.0, 51.0]}, {"huge pages": [100.0, 102.0], "mmap": [100.0, 102.0]}]
    lines = [json.dumps({"round": r, "variant": variant, "rc": 0, "peak_kib": {"AnonHugePages": 0},
                         "tests": [{"n_prompt": 512, "n_gen": 0, "samples_ts": [500.0]},
                                   {"n_prompt": 0, "n_gen": 64, "samples_ts": [values[r]]}]})
             for run in runs for r in range(2) for variant, values in run.items()]
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    main()
    out = capsys.readouterr().out.splitlines()
    assert _cells([line for line in out if line.startswith("| huge pages | ")][0])[1] == "4"  # every process counted
    cells = _cells([line for line in out if line.startswith("| mmap | ")][-1])
    assert cells[3].startswith(f"{2 ** 0.5:.2f} [")  # twice mmap's speed in the first run's rounds, alike in the second
