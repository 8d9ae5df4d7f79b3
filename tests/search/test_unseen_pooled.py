"""benchmarks/unseen_pooled.py: the unseen synthetic sets' misses counted per set and over all of them, from the
search_efficiency.py result files the repository keeps."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SETS = ("1896-1919", "1968-1991")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture
def pooled_main(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from unseen_pooled import main

    return main


def test_each_set_and_the_pool_count_what_the_result_files_say(pooled_main, capsys):
    paths = [BENCHMARKS / "results" / f"search-efficiency-{s}-fresh-noise.json" for s in SETS]
    assert pooled_main([str(p) for p in paths]) == 0
    rows = {(cells := _cells(line))[0]: cells for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| set ")}
    total, above, answers = 0, 0, []
    for name, path in zip(SETS, paths):
        ours = json.loads(path.read_text())
        n = len(ours)
        k = sum(o["boundary"]["median_noise_free"] > 12 for o in ours)
        cells = rows[name]
        assert cells[1] == str(n)
        assert cells[2].startswith(f"{k} ({k / n:.1%} [")
        total, above, answers = total + n, above + k, answers + [o["boundary"]["answer_median"] for o in ours]
    pooled = rows["pooled (2 sets)"]
    assert pooled[1] == str(total)
    assert pooled[2].startswith(f"{above} ({above / total:.1%} [")
    assert pooled[5].startswith(f"{statistics.median(answers):.1%}, ")
    assert pooled[5].endswith(f"{min(answers):.1%}")


def test_a_set_without_random_search_beside_it_is_a_one_line_error(pooled_main, tmp_path, capsys):
    name = f"search-efficiency-{SETS[0]}-fresh-noise.json"
    shutil.copy(BENCHMARKS / "results" / name, tmp_path / name)
    assert pooled_main([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "random100.json" in err and "--strategy random" in err


def test_a_file_that_is_not_a_fresh_noise_result_is_refused(pooled_main, capsys):
    path = BENCHMARKS / "results" / f"search-efficiency-{SETS[0]}-random100.json"
    assert pooled_main([str(path)]) == 2
    assert "fresh-noise.json" in capsys.readouterr().err


@pytest.mark.parametrize("fresh, random, says", [
    (None, "[]", "--strategy boundary"),  # the boundary search's file itself is missing
    ("[]", "[]", "no table-budget"),
    ('[{"table": "x"}]', "[]", "lacks 'budget_mib'"),
    ("{not json", "[]", "JSONDecodeError"),
])
def test_unreadable_result_files_are_one_line_errors(pooled_main, tmp_path, capsys, fresh, random, says):
    path = tmp_path / "search-efficiency-1-2-fresh-noise.json"
    if fresh is not None:
        path.write_text(fresh)
    (tmp_path / "search-efficiency-1-2-random100.json").write_text(random)
    assert pooled_main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_misses_list_every_table_budget_above_12_and_the_ratios_to_random_search(pooled_main, capsys):
    """--misses: the account search-efficiency.md gives of a set, each line from the two result files."""
    path = BENCHMARKS / "results" / f"search-efficiency-{SETS[1]}-fresh-noise.json"
    ours = json.loads(path.read_text())
    random = {(r["table"], r["budget_mib"]): r["random"] for r in json.loads(
        path.with_name(path.name.replace("fresh-noise", "random100")).read_text())}
    assert pooled_main(["--misses", str(path)]) == 0
    out = capsys.readouterr().out
    account = out[out.index(f"\n{SETS[1]}:\n"):]
    for key, name in (("median_noise_free", "noise-free"), ("median", "by rows")):
        above = [o for o in ours if o["boundary"][key] > 12]
        assert f"{name} above 12 on {len(above)}:" in account
        for o in above:
            line = (f"  {Path(o['table']).stem} at {o['budget_mib'] / 1024:g} GiB: noise-free "
                    f"{o['boundary']['median_noise_free']}, by rows {o['boundary']['median']}; traps {o['traps']}")
            assert line in account
        ratios = [o["boundary"][key] / random[(o["table"], o["budget_mib"])][key] for o in ours]
        assert f"against random search {name}: within 100 on " in account
        assert f"median ratio {statistics.median(ratios):.3f}, above a quarter on {sum(q > 0.25 for q in ratios)}" \
            in account
    worst = min(o["boundary"]["answer_median"] for o in ours)
    assert "worst answers after 12: " in account and f"{worst:.1%}" in account
