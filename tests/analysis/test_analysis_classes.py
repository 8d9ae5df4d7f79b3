"""`analyze --compare`: one study per hardware class, read side by side with the ratio of the shared configurations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from autoinfer.analysis.classes import classes_frame, compare_classes
from autoinfer.campaign.spec import load_campaign
from autoinfer.coordination import hardware
from autoinfer.store import trials as store
from autoinfer.sweep.runner import sweep

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]


def _campaign(tmp_path: Path, name: str, speed: float, threads: list[int]) -> Path:
    """A replay campaign whose table runs `speed` × (10 + threads) tok/s with ±3% noise per repetition."""
    rng = np.random.default_rng(len(name))
    rows = ["threads,tg,pp,tg_samples,rss_mib"]
    for t in range(1, 9):
        samples = speed * (10 + t) * np.exp(rng.normal(0, 0.03, 5))
        rows.append(f"{t},{np.median(samples):.3f},100,{' '.join(f'{s:.3f}' for s in samples)},{400 + t}")
    table = tmp_path / f"{name}.csv"
    table.write_text("\n".join(rows) + "\n")
    (tmp_path / "m").write_text("replay label\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "engine": "replay", "engine_options": {"table": str(table), "seed": 3}, "model": str(tmp_path / "m"),
        "space": {"threads": threads}, "budget": {"trials": 4}, "sampler": {"name": "random", "seed": 0},
        "measure": {"repetitions": 5, "max_cv": None}, "search": {"informed": False},
        "idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"enabled": False},
    }))
    return path


@pytest.fixture()
def two_classes(tmp_path, monkeypatch) -> str:
    """The same campaign on lab-a and on lab-b, a machine half as fast, each in its own study."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    for label, speed in (("lab-a", 1.0), ("lab-b", 0.5)):
        monkeypatch.setenv(hardware.OVERRIDE_ENV, label)
        sweep(load_campaign(_campaign(tmp_path, label, speed, [2, 6])), storage=url, progress=False)
    monkeypatch.delenv(hardware.OVERRIDE_ENV)
    return url


def test_analyze_compares_the_same_configuration_across_classes(two_classes, tmp_path):
    out = tmp_path / "report"
    res = subprocess.run([*CLI, "analyze", "--study", "lab-a", "--compare", "lab-b", "--storage", two_classes,
                          "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    classes = pd.read_csv(out / "classes.csv")
    digest = {label: hardware.declared_class(label).digest for label in ("lab-a", "lab-b")}
    assert list(classes["hardware_class"]) == [digest["lab-a"], digest["lab-b"]]
    assert list(classes["reference"]) == [True, False]
    assert classes["description"].tolist() == ["declared class 'lab-a'", "declared class 'lab-b'"]
    # both classes' best is the 6-thread configuration, at 16 and 8 tok/s (±3% noise, medians of 5+ samples)
    assert classes["median"].iloc[0] == pytest.approx(16, rel=0.06) and classes["median"].iloc[1] == pytest.approx(8, rel=0.06)
    shared = pd.read_csv(out / "classes-shared.csv")
    assert len(shared) == 2 and set(shared["hardware_class"]) == {digest["lab-b"]}
    assert ((shared["ratio_ci_low"] <= 0.5) & (0.5 <= shared["ratio_ci_high"]) & (shared["ratio_ci_high"] < 0.6)).all()
    md = (out / "report.md").read_text()
    assert "## Hardware classes" in md and "declared class 'lab-b'" in md
    assert f"class {digest['lab-b']} (declared class 'lab-b'): best" in res.stdout


def test_classes_without_a_shared_configuration_get_no_ratio(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    for label, threads in (("lab-a", [2]), ("lab-b", [7])):
        monkeypatch.setenv(hardware.OVERRIDE_ENV, label)
        sweep(load_campaign(_campaign(tmp_path, label, 1.0, threads)), storage=url, progress=False)
    frame, descriptions = classes_frame([store.load_study("lab-a", url), store.load_study("lab-b", url)])
    comparison = compare_classes(frame, descriptions, hardware.declared_class("lab-a").digest)
    assert comparison.shared.empty and len(comparison.classes) == 2


def test_an_unknown_study_to_compare_is_one_line(two_classes):
    res = subprocess.run([*CLI, "analyze", "--study", "lab-a", "--compare", "lab-c", "--storage", two_classes],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "no study 'lab-c'" in res.stderr and res.stderr.count("\n") == 1, res.stderr
