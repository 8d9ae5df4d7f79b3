"""benchmarks/refcontext_report.py: the reference engine's device memory by budget and its interleaved final against
llama.cpp, from the files the repository keeps of the H100 run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUN = BENCHMARKS / "results" / "refcontext-h100"


@pytest.fixture
def report_main(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from refcontext_report import main

    return main


def test_each_budget_splits_the_device_memory_as_its_files_say(report_main, capsys):
    assert report_main([str(RUN)]) == 0
    rows = {cells[0]: cells for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and (cells := [c.strip() for c in line.strip("| ").split("|")])[0].isdigit()}
    budgets = sorted(int(p.stem.split("-")[1]) for p in RUN.glob("refcontext-[0-9]*.json"))
    assert sorted(map(int, rows)) == budgets
    for budget in budgets:
        d = json.loads((RUN / f"refcontext-{budget}.json").read_text())
        peak = max(int(x) for x in (RUN / f"refcontext-nvml-{budget}.txt").read_text().split())
        neither = d["device_used_at_end_mib"] - d["device_used_at_start_mib"] - d["device_reserved_at_end_mib"]
        cells = rows[str(budget)]
        assert cells[5] == f"{d['device_used_at_start_mib']:.0f}" and cells[6] == f"{neither:.0f}"
        assert cells[7] == f"{peak} ({peak - budget:+d})"


def test_the_final_pairs_each_round_and_refuses_a_round_without_both_sides(report_main, capsys, tmp_path):
    assert report_main([str(RUN)]) == 0
    out = capsys.readouterr().out
    runs = len(list(RUN.glob("final-ref-*.json")))
    tg = next(line for line in out.splitlines() if line.startswith("tg: "))
    assert tg.count(",") == 2 * (runs - 1) + 1  # both sides' lists, one score per run
    assert "by round" in out and "paired-t" in out

    for path in RUN.iterdir():
        shutil.copy(path, tmp_path)
    (tmp_path / f"final-ref-{runs}.json").unlink()
    assert report_main([str(tmp_path)]) == 2
    assert "a round is missing a side" in capsys.readouterr().err


def test_a_folder_without_the_step_s_files_is_a_one_line_error(report_main, capsys, tmp_path):
    assert report_main([str(tmp_path)]) == 2
    assert "run gpu_evidence.sh refcontext" in capsys.readouterr().err
    shutil.copy(RUN / "refcontext-5632.json", tmp_path)  # its NVML samples missing
    assert report_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "refcontext-nvml-5632.txt" in err
