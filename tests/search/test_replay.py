"""The replay engine answers trials from a table; `autoinfer replay` compares strategies on it."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from autoinfer.cli import app
from autoinfer.engines import base
from autoinfer.engines.base import Outcome, RunContext, TrialConfig
from autoinfer.errors import UserError

from .planted import planted_table


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return planted_table(tmp_path_factory.mktemp("planted"))


def _config(row: pd.Series, repetitions: int = 5) -> TrialConfig:
    return TrialConfig(model=Path("m"), n_gpu_layers=int(row.n_gpu_layers), ubatch=int(row.ubatch),
                       repetitions=repetitions, extra=(("placement", row.placement),
                                                       ("cpu_expert_layers", int(row.cpu_expert_layers))))


def test_replay_reproduces_the_table(planted, tmp_path):
    df = pd.read_csv(planted)
    engine = base.create("replay", table=str(planted), seed=1)
    assert set(engine.knobs) == set({"n_gpu_layers", "placement", "cpu_expert_layers", "ubatch"})
    for index in range(0, len(df), 37):
        row = df.iloc[index]
        m = engine.run(_config(row), RunContext(timeout_s=1, artifacts=tmp_path))
        assert m.outcome is Outcome.OK and m.metrics["replay_row"] == index and m.metrics["replay_distance"] == 0
        assert not m.stand_in
        samples = [float(v) for v in row.tg_samples.split()]
        assert set(m.tg_samples) <= {round(v, 3) for v in samples} and len(m.tg_samples) == 5
        assert m.vram_peak_mib == row.vram_mib
    # without samples, a row's median comes back as is; a configuration between rows gets the nearest row
    plain = tmp_path / "plain.csv"
    df.drop(columns=["tg_samples", "pp_samples"]).to_csv(plain, index=False)
    engine = base.create("replay", table=str(plain))
    off_grid = _config(df.iloc[3]).with_(extra=(("placement", df.iloc[3].placement),
                                                 ("cpu_expert_layers", int(df.iloc[3].cpu_expert_layers) + 1)))
    m = engine.run(off_grid, RunContext(timeout_s=1, artifacts=tmp_path))
    assert m.metrics["replay_distance"] > 0 and statistics.median(m.tg_samples) == df.iloc[m.metrics["replay_row"]].tg
    assert m.stand_in  # another configuration's numbers, and the record says so


def test_per_gpu_peaks_replay_and_are_not_parameters(planted, tmp_path):
    df = pd.read_csv(planted)
    two = tmp_path / "two-gpus.csv"
    df.assign(vram_gpu0_mib=df.vram_mib, vram_gpu1_mib=df.vram_mib / 2).to_csv(two, index=False)
    engine = base.create("replay", table=str(two))
    assert set(engine.knobs) == set({"n_gpu_layers", "placement", "cpu_expert_layers", "ubatch"})
    row = df.iloc[5]
    m = engine.run(_config(row), RunContext(timeout_s=1, artifacts=tmp_path))
    assert m.vram_per_gpu_mib == (row.vram_mib, row.vram_mib / 2) and m.vram_peak_mib == row.vram_mib


def test_replay_prunes_on_request(planted, tmp_path):
    engine = base.create("replay", table=str(planted))
    row = pd.read_csv(planted).iloc[0]
    m = engine.run(_config(row), RunContext(timeout_s=1, artifacts=tmp_path, on_first_sample=lambda v: True))
    assert m.outcome is Outcome.PRUNED and len(m.tg_samples) == 1


@pytest.mark.parametrize("options, needle", [
    ({}, "needs engine_options.table"),
    ({"table": "/nonexistent.csv"}, "does not exist"),
    ({"table": "T", "sed": 1}, "engine_options.sed"),
    ({"table": "T", "fresh_noise": "yes"}, "is not true or false"),
    ({"table": "T", "fresh_noise": True}, "needs planted.noise-free.csv beside the table"),
])
def test_bad_replay_options(planted, options, needle):
    options = {k: (str(planted) if v == "T" else v) for k, v in options.items()}
    with pytest.raises(UserError, match=needle):
        base.create("replay", **options)


def test_fresh_noise_draws_a_new_process_around_the_noise_free_speed(tmp_path):
    """A row replayed again replays its one process's luck; with fresh_noise each run is a new process: its
    repetitions share one shift (process_sd) and scatter around it (repetition_sd), centred on the noise-free value,
    not on the row's lucky samples."""
    table = tmp_path / "lucky.csv"
    pd.DataFrame([{"threads": 1, "tg": 110.0, "pp": 50.0, "tg_samples": "110 110 110", "pp_samples": "50 50 50"}]
                 ).to_csv(table, index=False)
    free = {"tg": 100.0, "tg_process_sd": 0.05, "tg_repetition_sd": 0.0, "pp": 40.0, "pp_process_sd": 0.0,
            "pp_repetition_sd": 0.1}
    pd.DataFrame([free]).to_csv(tmp_path / "lucky.noise-free.csv", index=False)
    config = TrialConfig(model=Path("m"), threads=1, repetitions=3)
    frozen = base.create("replay", table=str(table)).run(config, RunContext(timeout_s=1, artifacts=tmp_path))
    assert frozen.tg_samples == (110.0,) * 3
    engine = base.create("replay", table=str(table), seed=3, fresh_noise=True)
    runs = [engine.run(config, RunContext(timeout_s=1, artifacts=tmp_path)) for _ in range(400)]
    shifts = [math.log(r.tg_samples[0] / 100.0) for r in runs]
    assert all(len(set(r.tg_samples)) == 1 for r in runs)  # no repetition noise: one shift per run
    assert abs(statistics.mean(shifts)) < 0.01 and 0.04 < statistics.stdev(shifts) < 0.06
    pp = [math.log(v / 40.0) for r in runs for v in r.pp_samples]
    assert abs(statistics.mean(pp)) < 0.02 and 0.08 < statistics.stdev(pp) < 0.12
    pd.DataFrame([{"tg": 100.0, "pp": 40.0}]).to_csv(tmp_path / "lucky.noise-free.csv", index=False)
    with pytest.raises(UserError, match="missing tg_process_sd"):
        base.create("replay", table=str(table), fresh_noise=True)


def test_fresh_noise_runs_a_process_slow_as_a_whole_by_its_chance(tmp_path):
    """Slow processes (slow_share, slow_log in the sidecar): a run is slow or not as a whole, tg and pp alike, with
    the row's chance; a row without the chance never is."""
    table = tmp_path / "bimodal.csv"
    pd.DataFrame([{"threads": t, "tg": 100.0, "pp": 40.0} for t in (1, 2)]).to_csv(table, index=False)
    free = {"tg": 100.0, "pp": 40.0, "tg_process_sd": 0.0, "tg_repetition_sd": 0.0, "pp_process_sd": 0.0,
            "pp_repetition_sd": 0.0}
    pd.DataFrame([{**free, "slow_share": 0.0, "slow_log": 0.0}, {**free, "slow_share": 0.3, "slow_log": 0.4}]
                 ).to_csv(tmp_path / "bimodal.noise-free.csv", index=False)
    engine = base.create("replay", table=str(table), seed=5, fresh_noise=True)
    ctx = RunContext(timeout_s=1, artifacts=tmp_path)
    runs = {t: [engine.run(TrialConfig(model=Path("m"), threads=t, repetitions=3), ctx) for _ in range(400)]
            for t in (1, 2)}
    assert all(r.tg_samples == (100.0,) * 3 and r.pp_samples == (40.0,) * 3 for r in runs[1])
    slow = [r for r in runs[2] if r.tg_samples[0] < 100.0]
    assert 0.22 < len(slow) / 400 < 0.38
    assert all(r.tg_samples == (pytest.approx(100.0 * math.exp(-0.4)),) * 3 for r in slow)
    assert all(r.pp_samples == (pytest.approx(40.0 * math.exp(-0.4)),) * 3 for r in slow)
    assert all(r.pp_samples == (40.0,) * 3 for r in runs[2] if r not in slow)
    pd.DataFrame([free, free]).assign(slow_share=0.3).to_csv(tmp_path / "bimodal.noise-free.csv", index=False)
    with pytest.raises(UserError, match="has slow_share without slow_log"):
        base.create("replay", table=str(table), fresh_noise=True)


def test_table_without_results_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("ubatch,speed\n1,2\n")
    with pytest.raises(UserError, match="no 'tg' or 'pp' column"):
        base.create("replay", table=str(bad))


def test_replay_command_prints_each_strategy(planted):
    result = CliRunner().invoke(app, ["replay", str(planted), "--sampler", "random,informed", "--seeds", "2",
                                      "--budget-mib", "16384", "--trials", "15"])
    assert result.exit_code == 0, result.output
    assert "random" in result.output and "informed" in result.output and "median trials" in result.output


def test_committed_cpu_table_replays_every_row(tmp_path):
    """benchmarks/tables/cpu-tiny.csv was measured with llama-bench here; replay gives each row back exactly."""
    table = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "cpu-tiny.csv"
    df = pd.read_csv(table)
    engine = base.create("replay", table=str(table), match="exact")
    assert engine.model_shape("m").n_layers == 4  # the sidecar describes the tiny model
    for index, row in df.iterrows():
        config = TrialConfig(model=Path("m"), n_gpu_layers=0, threads=int(row.threads), ubatch=int(row.ubatch),
                             flash_attn=row.flash_attn, type_k=row.type_k)
        m = engine.run(config, RunContext(timeout_s=1, artifacts=tmp_path))
        assert m.metrics["replay_row"] == index and m.rss_peak_mib == row.rss_mib
        assert set(m.tg_samples) <= {float(v) for v in row.tg_samples.split()}


def test_runs_are_also_scored_against_noise_free_values(tmp_path):
    """A generator's noise-free values set a second target: on a table whose best row is only lucky (noise-free it
    is the slowest), a run reaches the noise-free target at the row that is fastest without the noise."""
    from autoinfer.sweep.replay_cli import compare

    table = tmp_path / "lucky.csv"
    rows = [{"threads": t, "tg": tg, "pp": 100.0, "tg_samples": f"{tg} {tg}", "pp_samples": "100 100"}
            for t, tg in ((1, 100.0), (2, 90.0), (4, 80.0))]
    pd.DataFrame(rows).to_csv(table, index=False)
    free = pd.DataFrame({"tg": [70.0, 95.0, 60.0], "pp": [100.0] * 3})
    (result,), best = compare(table, ["random"], seeds=3, budget_mib=None, trials=3, noise_free=free)
    assert best == 100.0 and result.trials_needed_noise_free is not None
    # the two targets are two different rows (threads 1 by the table, threads 2 without noise): a run reaches each
    # at the trial that measured its row
    both = [(a, b) for a, b in zip(result.trials_needed, result.trials_needed_noise_free)
            if a is not None and b is not None]
    assert both and all(a != b for a, b in both)
    with pytest.raises(UserError, match="noise-free values"):
        compare(table, ["random"], seeds=1, budget_mib=None, trials=3, noise_free=free.iloc[:2])


def test_the_answer_after_the_first_trials_is_what_its_fastest_measurement_is_worth(tmp_path, monkeypatch):
    """A run's answer is the configuration it measured fastest, judged by what that configuration is worth: on the
    lucky table, once every row was measured, the lucky row (70 of the best 95 without noise), though a faster row
    was measured too; by the rows alone it is the best. Scored after one trial, it is the first row measured."""
    from autoinfer.sweep import replay_cli

    table = tmp_path / "lucky.csv"
    rows = [{"threads": t, "tg": tg, "pp": 100.0, "tg_samples": f"{tg} {tg}", "pp_samples": "100 100"}
            for t, tg in ((1, 100.0), (2, 90.0), (4, 80.0))]
    pd.DataFrame(rows).to_csv(table, index=False)
    free = pd.DataFrame({"tg": [70.0, 95.0, 60.0], "pp": [100.0] * 3})
    (result,), _ = replay_cli.compare(table, ["random"], seeds=3, budget_mib=None, trials=3, noise_free=free)
    assert result.answer == pytest.approx((70 / 95,) * 3)
    (by_rows,), _ = replay_cli.compare(table, ["random"], seeds=3, budget_mib=None, trials=3)
    assert by_rows.answer == (1.0,) * 3
    monkeypatch.setattr(replay_cli, "ANSWER_AT", 1)
    (first,), _ = replay_cli.compare(table, ["random"], seeds=6, budget_mib=None, trials=3, noise_free=free)
    assert set(first.answer) <= {70 / 95, 1.0, 60 / 95} and len(set(first.answer)) > 1
    assert all((a == 1.0) == (n == 1) for a, n in zip(first.answer, first.trials_needed_noise_free))


def test_the_trials_over_the_memory_budget_among_the_first_are_counted(tmp_path, monkeypatch):
    """Random search on a table of six rows, two of them over the budget: once it has measured every row, two of
    its trials were over; counted among the first two, as many as it drew there."""
    from autoinfer.sweep import replay_cli

    table = tmp_path / "heavy.csv"
    rows = [{"threads": t, "tg": 10.0 * t, "pp": 100.0, "vram_mib": 1000.0 + 100 * t} for t in range(1, 7)]
    pd.DataFrame(rows).to_csv(table, index=False)  # threads 5 and 6 peak at 1500 and 1600 MiB
    (result,), _ = replay_cli.compare(table, ["random"], seeds=4, budget_mib=1450, trials=6)
    assert result.over == (2,) * 4
    monkeypatch.setattr(replay_cli, "ANSWER_AT", 2)
    (first,), _ = replay_cli.compare(table, ["random"], seeds=8, budget_mib=1450, trials=6)
    assert set(first.over) <= {0, 1, 2} and len(set(first.over)) > 1
    (unbounded,), _ = replay_cli.compare(table, ["random"], seeds=2, budget_mib=None, trials=6)
    assert unbounded.over == (0, 0)


def test_a_row_standing_in_for_a_configuration_the_table_lacks_is_not_counted_over_the_budget(tmp_path):
    """threads x ubatch without (3, 2): its nearest row (2, 2) is over the budget and stands in for it. Random
    search measures all six configurations; one of them is over the budget by its own row."""
    from autoinfer.sweep import replay_cli

    table = tmp_path / "hole.csv"
    rows = [{"threads": t, "ubatch": u, "tg": 10.0 * t + u, "pp": 100.0, "vram_mib": 2000.0 if (t, u) == (2, 2) else
             1000.0} for t in (1, 2, 3) for u in (1, 2) if (t, u) != (3, 2)]
    pd.DataFrame(rows).to_csv(table, index=False)
    (result,), _ = replay_cli.compare(table, ["random"], seeds=3, budget_mib=1500, trials=6)
    assert result.over == (1,) * 3


def _processes_table(tmp_path: Path) -> Path:
    """Two configurations in three processes each: threads 1 steady at 100 tok/s, threads 2 at 130 in two
    processes and 60 in the third (a process slow as a whole); their peaks 500 and 510-530 MiB."""
    table = tmp_path / "processes.csv"
    rows = [{"threads": 1, "process": k, "tg": 100.0, "pp": 50.0, "rss_mib": 500.0} for k in range(3)]
    rows += [{"threads": 2, "process": k, "tg": tg, "pp": 80.0, "rss_mib": 500.0 + 10 * (k + 1)}
             for k, tg in enumerate((130.0, 60.0, 130.0))]
    pd.DataFrame(rows).to_csv(table, index=False)
    return table


def test_a_configuration_measured_in_several_processes_replays_one_of_them_per_run(tmp_path):
    """A run replays one of its configuration's processes, drawn at random: every process comes back, none of another
    configuration, and `process` is a result, not a parameter."""
    table = _processes_table(tmp_path)
    engine = base.create("replay", table=str(table), seed=4)
    assert set(engine.knobs) == {"threads"}
    ctx = RunContext(timeout_s=1, artifacts=tmp_path)
    rows = [engine.run(TrialConfig(model=Path("m"), threads=2, repetitions=1), ctx).metrics["replay_row"]
            for _ in range(60)]
    assert set(rows) == {3, 4, 5}
    slow = sum(r == 4 for r in rows)
    assert 8 < slow < 32  # a third of the draws, give or take
    assert {engine.run(TrialConfig(model=Path("m"), threads=1), ctx).metrics["replay_row"] for _ in range(30)} == {0, 1, 2}


def test_a_configuration_of_several_processes_is_worth_their_median(tmp_path):
    """The target is the best configuration by the median of its processes (130 for threads 2), not the luckiest
    process; its peak is their median (520 MiB), so a budget of 515 MiB leaves it out though one process fitted."""
    from autoinfer.sweep.replay_cli import goals

    table = _processes_table(tmp_path)
    scored = goals(table, "tg", None)
    assert scored.best == 130.0 and list(scored.target) == [100.0] * 3 + [130.0] * 3
    tight = goals(table, "tg", 515.0)
    assert tight.best == 100.0 and tight.target.iloc[3:].isna().all()


@pytest.mark.parametrize("process, needle", [(["0", "x", "0", "1"], "not a whole number"),
                                             ([0, 0, 0, 1], "repeats another row's configuration and process")])
def test_a_bad_process_column_is_refused_in_one_line(tmp_path, process, needle):
    table = tmp_path / "bad-processes.csv"
    pd.DataFrame({"threads": [1, 1, 2, 2], "process": process, "tg": 1.0}).to_csv(table, index=False)
    with pytest.raises(UserError, match=needle):
        base.create("replay", table=str(table))
