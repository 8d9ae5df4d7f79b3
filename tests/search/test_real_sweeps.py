"""The judgement of real sweeps (benchmarks/real_sweeps.py): an answer is worth its configuration's median over the
truth rounds, over the best such median; variants are compared seed by seed; a saved run is judged again from its
file; bad input is one line and exit 2."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pandas as pd
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import real_sweeps

    return real_sweeps


def _rounds(rs, speeds: dict[tuple, list[float]]) -> list[pd.DataFrame]:
    """Rounds in make_table's form; every configuration of the grid at 100 tok/s unless `speeds` says otherwise."""
    out = []
    for i in range(3):
        rows = []
        for values in itertools.product(*rs.GRID.values()):
            row = dict(zip(rs.GRID, values))
            rows.append({**row, "tg": speeds.get(values, [100.0] * 3)[i], "outcome": "ok"})
        out.append(pd.DataFrame(rows))
    return out


def _sweep(seed: int, answer: tuple, claimed: float) -> dict:
    return {"seed": seed, "answer": dict(zip(("threads", "ubatch", "type_k", "flash_attn", "repack", "load_mode"),
                                             answer)), "claimed": claimed, "confirmed": False, "again": 0}


FAST = (2, 64, "q8_0", "on", 1, "none")
SLOW = (1, 64, "q8_0", "on", 1, "none")


def test_an_answer_is_worth_its_median_over_the_rounds_and_variants_are_paired_by_seed(monkeypatch):
    """FAST's rounds 200 / 40 / 210 (one slow process): median 200, the best; SLOW 180 / 190 / 170: 0.9 of it. A
    variant that answers SLOW on seed 0 and FAST on seed 1 is worth √0.9 of one that answers FAST on both."""
    rs = _module(monkeypatch)
    rounds = _rounds(rs, {FAST: [200.0, 40.0, 210.0], SLOW: [180.0, 190.0, 170.0]})
    sweeps = {"a": [_sweep(0, FAST, 220.0), _sweep(1, FAST, 200.0)],
              "b": [_sweep(0, SLOW, 180.0), _sweep(1, FAST, 200.0)]}
    j = rs.judge(sweeps, rounds)
    assert j["best_tg"] == 200.0 and j["best"]["threads"] == "2"
    assert j["variants"]["a"]["worth_worst"] == 1.0 and j["variants"]["a"]["claimed_over_truth_median"] == pytest.approx(1.05)
    assert j["variants"]["b"]["worth_worst"] == pytest.approx(0.9)
    assert j["variants"]["b"]["within_98"] == 1 and j["variants"]["b"]["two_threads"] == 1
    pair = j["b/a"]
    assert (pair["seeds"], pair["better"], pair["worse"]) == (2, 0, 1)
    assert pair["geomean"] == pytest.approx(math.sqrt(0.9))


def test_a_variant_whose_answers_no_round_measured_is_reported_not_raised(monkeypatch):
    """A judgement that raised there lost the whole run: the sweeps and truth rounds are written after it."""
    rs = _module(monkeypatch)
    rounds = _rounds(rs, {FAST: [200.0, 200.0, 200.0]})
    unmeasured = (3, 64, "q8_0", "on", 1, "none")  # no round has three threads
    j = rs.judge({"a": [_sweep(0, FAST, 200.0)], "b": [_sweep(0, unmeasured, 150.0)]}, rounds)
    assert j["variants"]["b"] == {"sweeps": 1, "answers": 0, "unjudged": 1}
    assert j["variants"]["a"]["worth_median"] == 1.0 and "b/a" not in j


def test_a_saved_run_is_judged_again_from_its_file(monkeypatch, tmp_path, capsys):
    rs = _module(monkeypatch)
    rounds = _rounds(rs, {SLOW: [50.0, 50.0, 50.0]})
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"sweeps": {"a": [_sweep(0, SLOW, 55.0)]},
                                 "truth": pd.concat([r.assign(round=i) for i, r in enumerate(rounds)])
                                 .to_dict("records")}, default=str))
    assert rs.main(["--judge", str(saved)]) == 0
    assert json.loads(capsys.readouterr().out)["variants"]["a"]["worth_median"] == 0.5


def test_bad_input_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    rs = _module(monkeypatch)
    assert rs.main(["--variant", f"x={tmp_path}", "--out", str(tmp_path / "o.json")]) == 2
    assert rs.main([]) == 2
    assert rs.main(["--variant", "base", "--out", str(tmp_path / "o.json")]) == 2
    assert rs.main(["--seeds", "0", "--out", str(tmp_path / "o.json")]) == 2
    assert rs.main(["--judge", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text('{"sweeps": {}}')
    assert rs.main(["--judge", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and "no autoinfer package" in err[0] and "--out is required" in err[1]
    assert "give NAME=PATH" in err[2] and "--seeds 0" in err[3]
    assert all("not a saved run" in line for line in err[4:])


def test_the_confirmation_tests_are_judged_on_the_same_saved_runs(monkeypatch, tmp_path, capsys):
    """benchmarks/confirm_tests.py: one saved confirmation decided by each test. The machine speeds up round by round
    and FAST's process failed in the last two rounds, so its median comes from the slow rounds: Mann-Whitney picks
    SLOW, the paired test FAST (ahead in every round both ran); each pick is worth its truth over the best."""
    rs = _module(monkeypatch)
    import confirm_tests

    truth = pd.concat([r.assign(round=i) for i, r in enumerate(_rounds(rs, {FAST: [200.0] * 3, SLOW: [180.0] * 3}))])
    slow = [100.0, 110.0, 120.0, 130.0, 140.0]
    fast = [x * 1.05 * j for x, j in zip(slow[:3], (1.0, 0.99, 1.01))]
    runs = [{"trial": 0, "round": r, "score": x} for r, x in enumerate(slow)]
    runs += [{"trial": 1, "round": r, "score": fast[r] if r < 3 else None} for r in range(5)]
    saved = tmp_path / "tests.json"
    saved.write_text(json.dumps({"truth": truth.to_dict("records"), "confirmations": [{
        "sweep": "s", "alpha": 0.05, "memory_tolerance": 0.02, "speed_tolerance": 0.02, "runs": runs,
        "finalists": [{"trial": 0, "memory_mib": 100.0, "params": dict(zip(rs.GRID, SLOW))},
                      {"trial": 1, "memory_mib": 100.0, "params": dict(zip(rs.GRID, FAST))}]}]}))
    assert confirm_tests.main(["--judge", str(saved)]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert (judged["picks_differ"], judged["paired_better"]) == (1, 1)
    assert judged["worth_median"] == {"mannwhitney": pytest.approx(0.9), "paired": pytest.approx(1.0)}
    assert confirm_tests.main(["--judge", str(tmp_path / "missing.json")]) == 2
