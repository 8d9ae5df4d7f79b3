"""The report's generation-vs-prompt figure, from a real sweep of the replay engine over a measured H100 table:
the front within the budget is drawn with the recommendation marked, so a prompt-heavy user can pick a point."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from autoinfer.analysis.report import analyze
from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.replay import parameter_columns, read_table
from autoinfer.store.trials import MEMORY_STORAGE
from autoinfer.sweep.recommend import recommend
from autoinfer.sweep.replay_cli import OFFLINE, _space
from autoinfer.sweep.runner import sweep

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "h100-35b-load.csv"
BUDGET = 8192.0  # the front there trades 15% of generation for 4x the prompt (load mode): no noise hides it
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """12 trials of the boundary search on the table of load mode × ubatch × pattern (mmap vs none moves pp 2-4×),
    then `analyze`."""
    out = tmp_path_factory.mktemp("front")
    mp = pytest.MonkeyPatch()
    mp.setenv("AUTOINFER_RESULTS", str(out / "results"))
    df = read_table(TABLE)
    campaign = parse_campaign({
        "name": "front", "engine": "replay", "engine_options": {"table": str(TABLE), "seed": 0},
        "model": str(TABLE), "space": _space(df, parameter_columns(df)), "objective": "tg",
        "budget": {"trials": 12}, "constraints": {"vram_mib": BUDGET}, "sampler": {"name": "tpe", "seed": 0},
        "search": {"informed": True, "skip_predicted": True, "strategy": "boundary", "fit_params": False}, **OFFLINE,
    }, str(TABLE))
    study = sweep(campaign, storage=MEMORY_STORAGE, progress=False).study
    analyze(study, out / "report")
    mp.undo()
    return study, out / "report"


def _markers(svg: Path, group: str) -> list[tuple[float, float]]:
    """(x, y) of each marker matplotlib drew in the SVG group with this id."""
    root = ET.parse(svg).getroot()
    node = next(g for g in root.iter(f"{SVG}g") if g.get("id") == group)
    return [(float(u.get("x")), float(u.get("y"))) for u in node.iter(f"{SVG}use")]


def test_the_figure_draws_the_front_within_the_budget_and_marks_the_recommendation(report):
    study, out = report
    md = (out / "report.md").read_text()
    section = md.split("## Generation vs prompt processing")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| trials")]
    front = [[int(n) for n in r[0].split(",")] for r in rows]  # each configuration's trials
    assert len(front) >= 2, section
    assert (out / "tg_pp_front.png").stat().st_size > 0
    assert "![generation vs prompt tok/s within the budget](tg_pp_front.png)" in section
    svg = out / "tg_pp_front.svg"
    within = {json.dumps(t.params, sort_keys=True) for t in study.trials
              if t.user_attrs.get("outcome") == "ok" and t.user_attrs["vram_peak_mib"] <= BUDGET}
    assert len(_markers(svg, "trials")) == len(within) > len(front)  # one point per configuration
    drawn = _markers(svg, "front")
    assert len(drawn) == len(front)
    rec = recommend(study)
    (i,) = [i for i, trials in enumerate(front) if rec is not None and rec.trial in trials]
    assert "recommended" in rows[i][-1] and sum("recommended" in r[-1] for r in rows) == 1
    (star,) = _markers(svg, "recommendation")
    by_pp = sorted(range(len(rows)), key=lambda j: float(rows[j][2]))  # the front is drawn by ascending pp
    assert star == pytest.approx(drawn[by_pp.index(i)])
    # each front point is best for a range of prompt weights; together they cover 0..1, tg-heavy first
    ranges = [tuple(float(v) for v in r[5].split("–")) for r in rows if r[5].strip() != "none"]
    assert ranges[0][0] == 0.0 and ranges[-1][1] == 1.0
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
