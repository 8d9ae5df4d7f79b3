"""`autoinfer analyze` end to end: synthetic studies with planted truth, the seed data, and a real sweep."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap

import optuna
import pandas as pd
import pytest

from autoinfer.analysis.dataset import add_to_study
from autoinfer.analysis.importers import read_file, read_folder
from autoinfer.analysis.report import analyze
from autoinfer.store.trials import Store
from autoinfer.sweep.recommend import recommend, runs_of

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]


def _study(name: str, *files) -> optuna.Study:
    study = optuna.create_study(study_name=name, direction="maximize")
    add_to_study([read_file(f) for f in files], study)
    return study


def test_report_on_planted_bandwidth_data(placement_csv, planted, tmp_path):
    study = _study("planted", placement_csv)
    out = tmp_path / "report"
    analysis = analyze(study, out)
    fits = json.loads((out / "fits.json").read_text())
    assert fits["winner"] == {"by_aicc": "bandwidth", "by_holdout": "bandwidth"}
    assert fits["summary"].startswith("The bandwidth model explains the speeds best by AICc")
    bw = fits["fits"]["bandwidth"]
    assert not bw["identifiable"]  # one model file: only the marginal CPU cost is determined
    truth = 1 / (1 / planted["BW_cpu_GBps"] - 1 / planted["BW_gpu_GBps"])
    assert bw["cpu_marginal_GBps_ci"][0] <= truth <= bw["cpu_marginal_GBps_ci"][1]
    assert fits["fits"]["power_law"]["alpha_vs_M"]
    for name in ("speed_vs_cpu_gb", "pareto_vram", "history"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.svg").stat().st_size > 0
    md = (out / "report.md").read_text()
    assert md.index("## Recommendation") < md.index("## What explains the speed") < md.index("## Top configurations")
    best = analysis.configs.iloc[0]
    assert f"**{best['median']:.2f} tok/s**" in md
    html = (out / "report.html").read_text()
    assert '<img src="speed_vs_cpu_gb.png"' in html and "<table>" in html
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == len(study.trials) == len(pd.read_parquet(out / "trials.parquet"))
    assert trials["cpu_gb"].notna().sum() == len(study.trials)
    assert (trials["outcome"] == "oom").sum() == 1


def test_trials_the_drift_anchor_flagged_leave_the_tables_and_fits_as_they_leave_the_recommendation(
        placement_csv, tmp_path):
    """The fastest trial, flagged (measured while the machine had changed), is neither the top configuration nor
    a point of the fits; trials.csv keeps it, marked, and the report says which trials it left out."""
    study = _study("flagged", placement_csv)
    whole = analyze(study, tmp_path / "whole")
    fastest = whole.configs.iloc[0]
    Store(study).write_study(drift_flagged=frozenset({fastest["first_trial"]}))
    analysis = analyze(study, tmp_path / "flagged")
    assert fastest["config_key"] not in set(analysis.configs["config_key"])
    assert analysis.fitset.fits["bandwidth"].n == whole.fitset.fits["bandwidth"].n - 1
    trials = pd.read_csv(tmp_path / "flagged" / "trials.csv")
    assert trials.loc[trials["drift_flagged"], "trial"].tolist() == [fastest["first_trial"]]
    md = (tmp_path / "flagged" / "report.md").read_text()
    assert f"without the trial(s) the drift anchor flagged ({fastest['first_trial']}: measured while" in md
    rec = recommend(study)
    assert rec is not None and rec.trial != fastest["first_trial"]
    top = md.split("## Top configurations")[1].split("\n\n")[2].splitlines()[2]  # the table's first row
    assert top.endswith("| recommended |"), top
    Store(study).write_study(drift_flagged=frozenset(t.number for t in study.trials))
    analyze(study, tmp_path / "all")  # nothing trusted is left: the report says why, not "nothing succeeded"
    assert "Nothing to recommend: every successful trial was flagged by the drift anchor" in (
        tmp_path / "all" / "report.md").read_text()


def test_report_flags_more_threads_slower(threads_csv, tmp_path):
    analysis = analyze(_study("threads", threads_csv), tmp_path)
    (label, rows, fit, why), = analysis.fitset.threads
    assert fit is not None and fit.extra["more_threads_slower"] and why == ""
    md = (tmp_path / "report.md").read_text()
    assert "More threads were slower for 1 placement(s)" in md
    assert (tmp_path / "thread_scaling.svg").exists()
    fits = json.loads((tmp_path / "fits.json").read_text())
    assert fits["threads"][0]["more_threads_slower"] is True
    assert fits["skipped"]["power_law"] == "model file(s) not on this machine: m.gguf"


def test_report_on_the_seed_data(tmp_path, peer):
    results, _ = read_folder(peer)
    study = optuna.create_study(study_name="seed", direction="maximize")
    add_to_study(results, study)
    analysis = analyze(study, tmp_path)
    md = (tmp_path / "report.md").read_text()
    rec = md.split("## What explains the speed")[0]
    assert "**29.12 tok/s** (median of 17 run(s)" in rec
    assert "range 25.61–29.90 tok/s (mean 28.67" in rec
    assert "8 line(s) of the imported files were not results" in md
    assert "NVIDIA GeForce RTX 3070" in md
    assert analysis.importance and set(analysis.importance) >= {"n_gpu_layers", "quant"}
    assert (tmp_path / "pareto_vram.png").exists() and (tmp_path / "importance.png").exists()


@pytest.mark.slow
def test_report_for_a_real_sweep_on_the_tiny_model(llama_tools, tmp_path):
    campaign = tmp_path / "camp.yaml"
    campaign.write_text(textwrap.dedent("""\
        name: tiny-report
        engine: llama-bench
        model: synth:tiny
        space:
          n_gpu_layers: [0, 99]
          n_cpu_moe: {low: 0, high: 4}
          threads: {low: 1, high: 2}
        budget: {trials: 4}
        measure: {n_prompt: 16, n_gen: 4, repetitions: 3, timeout_s: 120}
        sampler: {name: random, seed: 0}
        """))
    env = {**os.environ, "AUTOINFER_LLAMA_BIN": str(llama_tools.bin_dir)}
    sweep = subprocess.run([*CLI, "sweep", str(campaign), "--quiet"], capture_output=True, text=True, env=env)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    done = subprocess.run([*CLI, "analyze", "--study", "tiny-report"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "results" / "tiny-report" / "report"
    trials = pd.read_csv(out / "trials.csv")
    # the budget counts the search's trials; a drift anchor on a busy host may queue a configuration again
    searched = trials[trials["remeasure_of"].isna()]
    assert len(searched) == 4 and set(trials["outcome"]) == {"ok"}
    assert set(trials["remeasure_of"].dropna()) <= set(searched["trial"])
    study = optuna.load_study(study_name="tiny-report", storage=f"sqlite:///{tmp_path / 'results' / 'autoinfer.db'}")
    # the trustworthy runs: trials the drift anchor did not flag and the anchor's own runs that did not drift (on a
    # busy host flagged trials are measured again, and a confirmation far off every search run is not used)
    kept = Store(study).study_record()
    runs = runs_of(Store(study).records(states=(optuna.trial.TrialState.COMPLETE,)), {"tg": 1.0},
                   set(kept.drift_flagged), kept.drift)
    by_config: dict[str, list[float]] = {}
    for run in runs:
        by_config.setdefault(run.config_key, []).append(run.score)
    best = max(statistics.median(scores) for scores in by_config.values())
    md = (out / "report.md").read_text()
    rec = recommend(study)  # a confirmation, when the sweep ran one, measured the finalists again and decides
    assert rec is not None and (rec.confirmed or rec.speed == pytest.approx(best))
    assert f"**{rec.speed:.2f} tok/s**" in md.split("## What explains the speed")[0]
    said = done.stdout.splitlines()  # the command line names the same answer, not the search's own top median
    assert said[0].startswith(f"recommended: trial {rec.trial}, {rec.speed:.2f} tok/s (median of {rec.runs} run"), said
    assert (trials["cpu_gb"] > 0).all()  # a CPU build keeps every weight in RAM, whatever -ngl asked
    fits = json.loads((out / "fits.json").read_text())
    assert set(fits["fits"]) | set(fits["skipped"]) == {"power_law", "bandwidth", "performance"}
    assert (out / "report.html").exists() and (out / "history.png").exists()


def test_a_table_in_the_project_format_is_accounted_by_its_placement(expert_table, tmp_path):
    imported = read_file(expert_table)
    assert not imported.junk
    for row in imported.rows:  # result columns are measurements, never parameters
        assert not {"wall_s", "tg_sd", "tg_samples", "rss_mib", "vram_mib"} & set(row.params), row.params
        assert len(row.tg_samples) == 3 and row.rss_peak_mib == 512.0
    study = _study("experts", expert_table)
    analysis = analyze(study, tmp_path)
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert "wall_s" not in analysis.importance
    # the experts each row keeps on the CPU are in its byte accounting: more layers' experts, more GB in RAM
    first = trials[trials["placement"] == "first"].sort_values("cpu_expert_layers")
    assert first["cpu_gb"].is_monotonic_increasing and first["cpu_gb"].nunique() == len(first)
    assert first["cpu_gb"].iloc[0] < 0.5 * first["cpu_gb"].iloc[-1]
    fits = json.loads((tmp_path / "fits.json").read_text())
    assert fits["winner"]["by_aicc"] in ("bandwidth", "performance")
    for name in ("bandwidth", "performance"):
        assert fits["fits"][name]["holdout_mape_pct"] < 5, fits["fits"][name]
