"""The boundary search on measured tables: it starts at the largest placement that fits, moves the other knobs
around the best trial, keeps whole-layer offload out where expert placement wins, and says why in `status`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.engines.replay import ReplayEngine, parameter_columns, read_table, shape_path
from autoinfer.model.memory import MemoryModel
from autoinfer.model.placement import command_key
from autoinfer.model.shape import ModelShape
from autoinfer.store.trials import MEMORY_STORAGE, Store
from autoinfer.sweep.repeats import EXHAUSTED
from autoinfer.sweep.replay_cli import OFFLINE, _space
from autoinfer.sweep.report import print_status
from autoinfer.sweep.runner import sweep

from .planted import shape_35b

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables"


def _replay(table: Path, budget: float, trials: int, seed: int = 0, strategy: str = "boundary"):
    df = read_table(table)
    campaign = parse_campaign({
        "name": f"boundary-{seed}", "engine": "replay", "engine_options": {"table": str(table), "seed": seed},
        "model": str(table), "space": _space(df, parameter_columns(df)), "objective": "tg",
        "budget": {"trials": trials}, "constraints": {"vram_mib": budget}, "sampler": {"name": "tpe", "seed": seed},
        "search": {"informed": True, "skip_predicted": True, "strategy": strategy, "fit_params": False}, **OFFLINE,
    }, str(table))
    return sweep(campaign, storage=MEMORY_STORAGE, progress=False).study


def _measured(study):
    return [t for t in Store(study).records() if not t.unmeasured]


@pytest.mark.parametrize("budget", [8192.0, 12288.0])
def test_first_trial_is_the_largest_placement_that_fits(budget):
    table = TABLES / "h100-35b-knobs.csv"
    df = pd.read_csv(table)
    study = _replay(table, budget, trials=1)
    first = _measured(study)[0]
    fitting = df[df.vram_mib <= budget].cpu_expert_layers.min()  # fewest expert layers in RAM that fit
    assert first.params["cpu_expert_layers"] == fitting
    assert first.vram_peak_mib <= budget
    assert first.search_reason.startswith("boundary:")


def test_local_moves_then_the_best_row_within_a_few_trials():
    table = TABLES / "h100-35b-knobs.csv"
    df = pd.read_csv(table)
    budget = 12288.0
    study = _replay(table, budget, trials=8)
    measured = _measured(study)
    reasons = [t.search_reason for t in measured]
    assert reasons[0].startswith("boundary:") and any(r.startswith("local:") for r in reasons[1:4])
    best_row = df[df.vram_mib <= budget].tg.max()
    rows = [t.metrics["replay_row"] for t in measured if t.outcome == "ok"]
    assert max(df.tg.iloc[r] for r in rows) >= 0.98 * best_row
    # every move keeps the boundary placement: nothing far from it is measured while moves are left
    assert all(t.params["cpu_expert_layers"] <= 24 for t in measured[:4])


def test_whole_layer_offload_stays_out_where_expert_placement_wins():
    table = TABLES / "h100-35b.csv"  # whole-layer rows (n_gpu_layers 20-36) beside expert placements at 99
    study = _replay(table, 8192.0, trials=6)
    proposed = [t for t in _measured(study) if str(t.search_reason or "").startswith(("boundary", "local"))]
    assert proposed and all(t.params["n_gpu_layers"] == 99 for t in proposed)


@pytest.mark.parametrize("budget", [8192.0, 12288.0])
def test_the_samplers_whole_layer_offloads_are_left_out_where_expert_placement_wins(budget):
    """On the H200 table of whole layers beside expert layers in RAM, every whole-layer offload is slower than an
    expert placement of no more memory. Once the local moves are measured, TPE proposes them; they are recorded as
    predicted_slower with the model's ratio, not measured, and the sweep stops when every configuration of the space
    was measured or left out, instead of spinning on proposals it cannot run."""
    table = TABLES / "h200-35b-whole-layers.csv"
    df = pd.read_csv(table)
    study = _replay(table, budget, trials=30, seed=1)
    records = Store(study).records()
    measured = _measured(study)
    slower = [t for t in records if t.outcome == "predicted_slower"]
    assert slower and all(t.unmeasured and t.params["n_gpu_layers"] < 99 and "to beat it" in t.reason for t in slower)
    assert all(t.params["n_gpu_layers"] == 99 for t in measured) and len(measured) < 30
    assert len(records) < 200  # stopped, not spinning until the skip limit (301 in a row, ~1000 records) made it
    drawn = [t for t in records if t.explore_after_repeats is not None]  # the runner's draws stand in for TPE's
    assert drawn and all(t.search_reason.startswith("sampler: drawn at random, unmeasured, after") for t in drawn)
    assert Store(study).study_record().stopped.endswith(EXHAUSTED)  # and says why, for `status`
    best = df[(df.vram_mib <= budget)].tg.max()
    assert max(df.tg.iloc[t.metrics["replay_row"]] for t in measured if t.outcome == "ok") == best


@pytest.mark.parametrize("budget", [12288.0, 16384.0])
def test_after_the_local_moves_it_explores_the_configurations_the_models_give_a_chance_first(budget):
    """On the H200 table of three processes per configuration the best rows keep a share just below the boundary,
    and a process's luck hides which. Once the local moves were measured, TPE, which knows neither model, measured
    placements far below (20-30 layers' experts in RAM, a third slower); the exploration draws from the space and
    measures first what the models give a chance: the shares next to the boundary, predicted within the budget."""
    table = TABLES / "h200-35b-partial-processes.csv"
    df = pd.read_csv(table)
    study = _replay(table, budget, trials=12)
    measured = _measured(study)
    shown = [(t.number, t.params, t.search_reason) for t in measured]
    explored = [t for t in measured if str(t.search_reason).startswith("explore:")]
    assert explored and not any(str(t.search_reason).startswith("sampler:") for t in measured), shown
    nearest = df[df.vram_mib <= budget].cpu_expert_layers.min()  # the fewest layers' experts in RAM that fit
    assert all(t.params["cpu_expert_layers"] <= nearest + 3 for t in explored), shown
    assert all(t.predicted_mib <= budget for t in explored), shown


def test_a_pareto_objective_leaves_the_exploration_to_the_sampler():
    """A Pareto objective has a front, not one incumbent whose predicted gain the exploration could draw from: after
    the local moves the campaign's sampler proposes, as before the exploration existed."""
    table = TABLES / "h200-35b-partial-processes.csv"
    df = read_table(table)
    campaign = parse_campaign({
        "name": "pareto", "engine": "replay", "engine_options": {"table": str(table), "seed": 0},
        "model": str(table), "space": _space(df, parameter_columns(df)), "objective": "pareto",
        "budget": {"trials": 12}, "constraints": {"vram_mib": 16384.0}, "sampler": {"name": "tpe", "seed": 0},
        "search": {"informed": True, "skip_predicted": True, "strategy": "boundary", "fit_params": False}, **OFFLINE,
    }, str(table))
    reasons = [str(t.search_reason) for t in _measured(sweep(campaign, storage=MEMORY_STORAGE, progress=False).study)]
    assert any(r.startswith("sampler:") for r in reasons), reasons
    assert not any(r.startswith("explore:") for r in reasons), reasons


def test_a_row_standing_in_for_a_placement_the_table_lacks_does_not_widen_the_memory_model():
    """Once the local moves are measured, TPE proposes whole-layer offload with expert placement, which the first
    H100 table lacks: `-ngl 28` with the last 16 layers' experts replays `-ngl 99`'s row (12762 MiB; measured on an
    H200 at 6912, benchmarks/tables/h200-35b-whole-layers.csv). Calibrated on that, the memory model's standard
    deviation went from ~350 to ~2000 MiB and the screen let proposals predicted 20-37% over the budget run. (The
    informed start, whose sampler is not kept from whole-layer offload as the boundary search's is.)"""
    study = _replay(TABLES / "h100-35b.csv", 8192.0, trials=14, seed=1, strategy="informed")
    measured = _measured(study)
    stand_ins = [t for t in measured if t.stand_in]
    assert stand_ins and all(t.metrics["replay_distance"] > 0 for t in stand_ins)
    later = [t for t in measured[3:] if t.predicted_std_mib is not None]
    assert later and max(t.predicted_std_mib for t in later) < 600
    assert not [t for t in measured if not t.stand_in and t.vram_peak_mib > 8192.0]


def test_status_explains_the_choices():
    study = _replay(TABLES / "h100-35b-knobs.csv", 8192.0, trials=4)
    console = Console(record=True, width=200)
    print_status(console, study)
    text = console.export_text()
    assert "boundary: fastest placement predicted to fit" in text and "local:" in text
    assert "sweep stopped" in text and "trial budget of 4 reached" in text


def test_an_incumbent_no_move_beats_is_measured_once_more(tmp_path):
    """Every configuration measures the same: no move beats the first incumbent, whose single measurement might have
    been lucky, so it is measured again (tagged, counted as a trial), once, before the sampler takes over."""
    table = tmp_path / "flat.csv"
    rows = [{"threads": t, "type_k": k, "tg": 100.0, "pp": 500.0, "tg_samples": "100 100 100",
             "pp_samples": "500 500 500"} for t in (4, 8) for k in ("f16", "q8_0")]
    pd.DataFrame(rows).to_csv(table, index=False)
    df = read_table(table)
    campaign = parse_campaign({
        "name": "flat", "engine": "replay", "engine_options": {"table": str(table), "seed": 0},
        "model": str(table), "space": _space(df, parameter_columns(df)), "objective": "tg",
        "budget": {"trials": 8}, "sampler": {"name": "tpe", "seed": 0},
        "search": {"informed": True, "skip_predicted": True, "strategy": "boundary", "fit_params": False}, **OFFLINE,
    }, str(table))
    study = sweep(campaign, storage=MEMORY_STORAGE, progress=False).study
    again = [t for t in _measured(study) if t.again_of is not None]
    assert len(again) == 1, [t.search_reason for t in _measured(study)]
    (t,) = again
    first = study.trials[t.again_of]
    assert first.params == t.params and first.number < t.number and t.repeat_of is None
    assert t.search_reason.startswith("again: no move or combination the model expects to beat trial")
    assert t.outcome == "ok" and t.tg_samples


def _table_sweep(tmp_path: Path, rows: list[dict], trials: int, objective: str | dict = "tg", constraints=None,
                 storage: str = MEMORY_STORAGE):
    table = tmp_path / "knobs.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    df = read_table(table)
    campaign = parse_campaign({
        "name": "knobs", "engine": "replay", "engine_options": {"table": str(table), "seed": 0},
        "model": str(table), "space": _space(df, parameter_columns(df)), "objective": objective,
        "budget": {"trials": trials}, "constraints": constraints or {}, "sampler": {"name": "tpe", "seed": 0},
        "search": {"informed": True, "skip_predicted": True, "strategy": "boundary", "fit_params": False}, **OFFLINE,
    }, str(table))
    return sweep(campaign, storage=storage, progress=False).study


def test_a_trial_queued_again_by_the_drift_anchor_is_not_called_the_samplers(tmp_path):
    """A re-measurement the drift anchor queued runs as queued, and its record names no sampler's choice: `status`
    listed each one as "sampler: tpe (no local move or exploration draw was left)", and the gate on the sampler's
    whole-layer proposals could have left it out."""
    rows = [{"threads": t, "type_k": k, "tg": 100.0 + t + (k == "q8_0"), "pp": 500.0} for t in (1, 2) for k in
            ("f16", "q8_0")]
    storage = f"sqlite:///{tmp_path / 'drift.db'}"
    study = _table_sweep(tmp_path, rows, trials=2, storage=storage)
    first = Store(study).record(0)
    Store(study).enqueue(dict(first.params), remeasure_of=0)
    study = _table_sweep(tmp_path, rows, trials=2, storage=storage)  # the budget is spent: only the re-measurement
    (again,) = [t for t in Store(study).records() if t.remeasure_of == 0]
    assert again.outcome == "ok" and not again.unmeasured and again.params == first.params
    assert again.search_reason is None, again.search_reason
    console = Console(record=True, width=200)
    print_status(console, study)
    text = console.export_text()
    assert "2 done of 2, 0 remaining; 1 drift re-measurement(s) beside them, outside the budget" in text, text
    assert "chosen by the sampler" not in text, text


def test_a_value_measured_much_slower_is_not_measured_again_from_the_next_incumbent(tmp_path):
    """Four threads are 40% slower whatever the other knobs (a quantized K cache 5% faster, flash attention 3%):
    measured once, the model knows it, and the moves from each new incumbent leave four threads out."""
    rows = []
    for threads in (1, 2, 4):
        for type_k in ("f16", "q8_0"):
            for fa in ("off", "on"):
                tg = 100.0 * (0.6 if threads == 4 else 1.0) * (1.05 if type_k == "q8_0" else 1.0) * \
                    (1.03 if fa == "on" else 1.0)
                rows.append({"threads": threads, "type_k": type_k, "flash_attn": fa, "tg": tg, "pp": 500.0,
                             "tg_samples": f"{tg * 0.99:.2f} {tg:.2f} {tg * 1.01:.2f}", "pp_samples": "500 500 500"})
    study = _table_sweep(tmp_path, rows, trials=10)
    measured = _measured(study)
    reasons = [t.search_reason for t in measured]
    assert sum(t.params["threads"] == 4 for t in measured) == 1, reasons
    best = max(rows, key=lambda r: r["tg"])
    assert any(t.params == {k: best[k] for k in ("threads", "type_k", "flash_attn")} for t in measured), reasons


def test_a_value_two_steps_along_an_ordered_knob_is_a_move(tmp_path):
    """16 threads measured faster than 12, 8 slower than 16, 4 the fastest (a bumpy thread curve, as on synthetic-335
    at 8 GiB). With an ordered knob's neighbours as its only moves, 4 threads was two steps from the incumbent: it was
    reached only through a combination that changed the K cache too, as the 6th trial. As a move it is the 4th."""
    speed = {4: 112.0, 8: 94.0, 12: 90.0, 16: 100.0}
    rows = [{"threads": t, "type_k": k, "tg": v * f, "pp": 500.0,
             "tg_samples": f"{v * f * 0.99:.2f} {v * f:.2f} {v * f * 1.01:.2f}", "pp_samples": "500 500 500"}
            for t, v in speed.items() for k, f in (("f16", 1.0), ("q8_0", 0.97))]
    measured = _measured(_table_sweep(tmp_path, rows, trials=6))
    reasons = [t.search_reason for t in measured]
    four = next(t for t in measured if t.params["threads"] == 4)
    assert four.search_reason.startswith("local: threads 16 → 4"), reasons
    assert four.params == {"threads": 4, "type_k": "f16"} and four.number <= 3, reasons


@pytest.mark.parametrize("objective", ["tg", {"tg": 0.5, "pp": 0.5}])
def test_prompt_only_knobs_move_last_for_a_decode_objective(tmp_path, objective):
    """ubatch sizes the prompt's batches, not a decode step: for tg its moves wait until threads and the K cache
    have been moved (their order before is the knob order, ubatch before type_k); where the prompt counts, ubatch
    moves in its turn."""
    rows = [{"threads": t, "ubatch": u, "type_k": k, "pp": 500.0 * u / 512,
             "tg": 100.0 * (1.05 if t == 16 else 1) * (1.04 if k == "q8_0" else 1)}
            for t in (8, 16) for u in (256, 512, 1024) for k in ("f16", "q8_0")]
    for r in rows:
        r["tg_samples"] = " ".join(f"{r['tg'] * f:.2f}" for f in (0.99, 1.0, 1.01))
        r["pp_samples"] = " ".join(f"{r['pp'] * f:.2f}" for f in (0.99, 1.0, 1.01))
    measured = _measured(_table_sweep(tmp_path, rows, trials=6, objective=objective))
    reasons = [t.search_reason for t in measured]
    first_ubatch = min(i for i, r in enumerate(reasons) if r.startswith("local: ubatch"))
    first_type_k = min(i for i, r in enumerate(reasons) if r.startswith("local: type_k"))
    assert (first_ubatch > first_type_k) == (objective == "tg"), reasons


def test_status_shows_what_the_search_knows_of_the_space(tmp_path):
    """The search's notes reach `status` under the boundary strategy too: the missing shape (no memory model), how
    many trials one pass of one-knob moves takes against the budget, and which knobs move last."""
    rows = [{"threads": t, "ubatch": u, "type_k": k, "tg": 100.0, "pp": 500.0, "vram_mib": 1000.0 + u,
             "tg_samples": "99 100 101", "pp_samples": "499 500 501"}
            for t in (8, 16) for u in (256, 512, 1024) for k in ("f16", "q8_0")]
    console = Console(record=True, width=400)
    print_status(console, _table_sweep(tmp_path, rows, trials=4, constraints={"vram_mib": 4096}))
    text = console.export_text()
    assert "no model shape for knobs.csv" in text, text
    assert ("4 one-knob moves (threads 1, ubatch 2, type_k 1): one pass over them takes at least 5 trials, the "
            "budget 4: the budget ends before every knob value has been measured once") in text, text
    assert "objective tg: ubatch move after the other knobs" in text, text


def test_a_placement_measured_over_with_some_knobs_is_carried_over_to_knobs_that_fit(tmp_path, monkeypatch):
    """Synthetic table 108 at 12247.6 MiB (12 GiB less the 40.4 MiB its ubatch-512 rows lost when the compute
    buffer became the largest set alive at once, so the table's budget sits where it sat): experts of 28 layers in
    RAM fit only with a q8_0 K cache and flash attention (12241.7 MiB); with f16 and flash attention off they
    measured 12266.5. The memory model alone puts the fitting combination over the budget, so the search used to
    stay at 32 layers (9% slower); the measured peak, carried over by the model's predicted difference, says it
    fits, and it is measured."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    table = synthetic_table(tmp_path, 108)
    study = _replay(table, 12247.6, trials=14, seed=2)
    measured = _measured(study)
    reasons = [t.search_reason for t in measured]
    carried = [t for t in measured if "carried over to fit" in str(t.search_reason)]
    assert carried, reasons
    assert all(t.params["cpu_expert_layers"] == 28 and t.vram_peak_mib <= 12247.6 for t in carried), reasons


def test_a_command_line_is_measured_once_under_whichever_placement_name(tmp_path, monkeypatch):
    """Synthetic table 298 at 16 GiB: every expert fits on the GPU, where the placement pattern is moot. The search
    measured the incumbent again as `even` and `first` (the same llama.cpp command line) as if they were moves; only
    its deliberate re-measurement (`again_of`) may repeat a command line."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    table = synthetic_table(tmp_path, 298)
    n_layers = ModelShape.from_json(shape_path(table).read_text()).n_layers
    study = _replay(table, 16384.0, trials=20)
    commands = [command_key(TrialConfig.from_params(t.config), n_layers)
                for t in _measured(study) if t.again_of is None]
    assert len(commands) == len(set(commands)), [t.search_reason for t in _measured(study)]


def test_a_share_measured_over_is_not_probed_again_under_another_pattern(tmp_path, monkeypatch):
    """Synthetic table 297 at 12 GiB: experts of 10 layers in RAM measured 12593 MiB with the `last` pattern
    (trial 1). Before any pair of trials told how far the memory model's predicted differences miss, nothing was
    carried over, so the `even` pattern's move probed the same share (12593 MiB again). The predicted difference,
    trusted to within its own size, keeps it out: at most one trial over the budget, not two (none since a probe
    next to a measured fit is sized by the spread of its predicted difference from that fit)."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 297), 12288.0, trials=12)
    over = [t for t in _measured(study) if t.outcome == "infeasible"]
    assert len(over) <= 1, [(t.number, t.search_reason) for t in _measured(study)]


def test_a_peak_is_carried_over_by_the_difference_measured_at_another_share(tmp_path, monkeypatch):
    """Synthetic table 781 at 8 GiB: experts of 32 layers in RAM measured 8247 MiB with an f16 K cache and flash
    attention off, 55 MiB over; with flash attention on they fit (8187). The memory model put flash attention with a
    q8_0 K cache 15 MiB lower where the pairs measured at 36 layers differ by 60-64, so the carried-over peak stayed
    over the budget and the search stayed at 36 layers (8% slower) for 30 trials on 7 of 10 seeds under fresh noise.
    The difference measured at the other share carries the peak over instead, and 32 layers are measured."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 781), 8192.0, trials=14, seed=2)
    measured = _measured(study)
    carried = [t for t in measured if "carried over to fit" in str(t.search_reason)]
    assert carried, [t.search_reason for t in measured]
    assert all(t.params["cpu_expert_layers"] == 32 and t.vram_peak_mib <= 8192 for t in carried)


def test_a_smaller_ubatch_reaches_the_faster_share_its_carried_peak_may_fit(tmp_path, monkeypatch):
    """Synthetic table 908 at 8 GiB, whose compute buffers are 2x the memory model's: the first trial, experts of 12
    layers in RAM with ubatch 512, measured 9025 MiB (833 over) and the boundary fell to 14 layers. ubatch 128 frees
    926 MiB there, where the model says 624, so the boundary for ubatch 128 stays at 14 and, as a prompt-only knob,
    it moved after every other knob: ubatch 128 at 14 layers as the 10th trial, then 12 layers with it as the 11th.
    Its peak carried over from the first trial may fit (24%) and 12 layers are ×1.09 faster, so that share is a move
    of its own, ranked by the two chances together: 12 layers with ubatch 128 fit and are measured without the trial
    at 14 layers before them, by the 9th trial."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 908), 8192.0, trials=10)
    measured = _measured(study)
    reasons = [t.search_reason for t in measured]
    reached = [t for t in measured if "(reach: a faster share" in str(t.search_reason)]
    assert reached and reached[0].number <= 8, reasons
    first = reached[0]
    assert first.params["cpu_expert_layers"] == 12 and first.params["ubatch"] == 128 and first.vram_peak_mib <= 8192
    assert not any(t.params["ubatch"] == 128 for t in measured if t.number < first.number), reasons
    assert measured[0].params["cpu_expert_layers"] == 12 and measured[0].vram_peak_mib > 8192


def test_knobs_that_free_memory_reach_a_faster_share_never_measured(tmp_path, monkeypatch):
    """Synthetic table 1040 at 12 GiB, whose compute buffers are 1.34x the memory model's: the best row keeps 20
    layers' experts in RAM with ubatch 128 (12149 MiB). The model put 20 layers over the budget with every ubatch, so
    the boundary stayed at 25, and no trial had measured 20 layers for a peak to carry over: the share came only once
    ubatch 2048 had been measured and the model had learned the buffers' size, as the 14th trial. The incumbent's
    peak, carried over to 20 layers by the predicted difference with the knob part's own size as its spread, may fit,
    so 20 layers with ubatch 128 is a move of its own, measured within the first 8 trials, and fits."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 1040), 12288.0, trials=8)
    measured = _measured(study)
    reasons = [t.search_reason for t in measured]
    reached = [t for t in measured if "at another share:" in str(t.search_reason)]
    assert reached, reasons
    first = reached[0]
    assert first.params["cpu_expert_layers"] == 20 and first.params["ubatch"] == 128, reasons
    assert first.vram_peak_mib <= 12288
    assert all(t.params["cpu_expert_layers"] == 25 for t in measured if t.number < first.number), reasons


def test_a_reach_worth_more_than_the_likeliest_move_comes_first(tmp_path, monkeypatch):
    """Synthetic table 1308 at 16 GiB: the first trial, experts of 8 layers in RAM with ubatch 512, fits with 1.5 GiB
    to spare; 4 layers, 1.28x faster, fit only with ubatch 128 (16334 MiB), and its carried peak gave that 24% to fit.
    Ranked by the chance to beat the incumbent, 17 knob moves at 8 layers (even chances of a percent or two) came
    first under fresh noise on seed 0, and the answer after 12 trials was 72-74% of the best row on 4 of 5 seeds.
    Its expected gain is larger, so it is the second trial, and fits."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 1308), 16384.0, trials=2)
    first, second = _measured(study)
    assert first.params["cpu_expert_layers"] == 8 and first.params["ubatch"] == 512, first.search_reason
    assert second.params["cpu_expert_layers"] == 4 and second.params["ubatch"] == 128, second.search_reason
    assert "more than the likeliest move's" in second.search_reason and second.vram_peak_mib <= 16384


def test_a_share_measured_over_is_not_reached_with_knob_values_that_need_more(tmp_path, monkeypatch):
    """Synthetic table 1321 at 12 GiB: no expert in RAM measured 98 MiB over the budget with ubatch 512 (trial 0).
    ubatch 2048 needs more memory, yet that share's peak carried over to it had the predicted difference's own size
    (2247 MiB) as its spread, 21% to fit, and once a reach was ranked by its expected gain it was measured, 3172 MiB
    over. A peak measured over carries over without doubt to knob values that need no less: one trial over, not
    two or three."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 1321), 12288.0, trials=8)
    measured = _measured(study)
    over = [t for t in measured if t.outcome == "infeasible"]
    assert len(over) == 1 and over[0].number == 0, [(t.number, t.params, t.search_reason) for t in measured]


def test_after_two_wrong_predictions_the_step_down_spares_what_the_latest_missed_by(tmp_path, monkeypatch):
    """Synthetic table 1290 at 12 GiB: the first two placements, predicted to fit, measured 1526 and 69 MiB more
    than predicted (240 before the calibrated mean followed the measured peaks) and over the budget. The bisection
    then went to the middle of every placement from the smallest, 7471 MiB (as an H100 sweep went from 8.2 to 5.3
    GiB, vs-fit-h100.md at ef2e2ac), and took three trials to the boundary's 11353. With nothing measured to fit yet,
    the next step keeps as much to spare as the latest (the calibrated model's) prediction missed by: the boundary
    at once, and the local moves from the next trial."""
    monkeypatch.syspath_prepend(str(TABLES.parent))
    from synthetic_tables import synthetic_table

    study = _replay(synthetic_table(tmp_path, 1290), 12288.0, trials=4)
    measured = _measured(study)
    assert [t.outcome for t in measured] == ["infeasible", "infeasible", "ok", "ok"], \
        [(t.number, t.vram_peak_mib, t.search_reason) for t in measured]
    third, fourth = measured[2:]
    assert "the latest by 69 MiB" in third.search_reason and 11000 < third.vram_peak_mib <= 12288, \
        third.search_reason
    assert fourth.search_reason.startswith("local:"), fourth.search_reason


@pytest.mark.parametrize("preferred, first", [(None, 12), (16, 16)])
def test_the_start_runs_the_threads_the_engine_prefers_where_the_space_has_them(tmp_path, monkeypatch, preferred,
                                                                                first):
    """With a device budget the llama.cpp engines prefer llama.cpp's own thread count (one per physical core); the
    first trial runs it where the space has it, else the middle value."""
    if preferred is not None:
        plain = ReplayEngine.preferred_values
        monkeypatch.setattr(ReplayEngine, "preferred_values",
                            lambda self, device: {**plain(self, device), "threads": preferred})
    rows = [{"threads": t, "tg": 100.0 + t, "pp": 500.0, "vram_mib": 1000.0} for t in (8, 12, 16)]
    study = _table_sweep(tmp_path, rows, trials=1, constraints={"vram_mib": 8192})
    (trial,) = _measured(study)
    assert trial.params["threads"] == first, trial.search_reason


def _host_buffers_rows(folder: Path) -> tuple[list[dict], float]:
    """The last 20-32 layers' experts in RAM × load mode × huge pages on the 35B shape (its shape beside the table
    _table_sweep writes), peaks as the memory model predicts them, the weights outside pinned buffers 8% faster; and
    a budget 20 MiB above the pinned peak of 26 layers, so that their unpinned twin (56 MiB above at ubatch 512) is
    over."""
    shape = shape_35b()
    model = MemoryModel(shape, "device")
    rows = []
    for layers in range(20, 33):
        for load_mode in ("mmap", "none"):
            for huge in (0, 1):
                config = TrialConfig(model=Path("m"), load_mode=load_mode,
                                     extra=(("placement", "last"), ("cpu_expert_layers", layers), ("huge_pages", huge)))
                tg = 1 / (1 / 240 + layers * 0.0003) * (1.08 if config.host_weights_unpinned() else 1.0)
                rows.append({"placement": "last", "cpu_expert_layers": layers, "load_mode": load_mode,
                             "huge_pages": huge, "tg": tg, "pp": 500.0, "vram_mib": round(model.predict(config).mib, 1),
                             "tg_samples": f"{tg:.3f} {tg:.3f} {tg:.3f}", "pp_samples": "500 500 500"})
    shape_path(folder / "knobs.csv").write_text(shape.to_json())
    pinned = {r["cpu_expert_layers"]: r["vram_mib"] for r in rows if r["load_mode"] == "mmap"}
    return rows, pinned[26] + 20.0


def test_pinned_twins_get_the_share_that_fits_them_pinned(tmp_path):
    """The start holds the weights outside pinned buffers, at 27 layers (26 are over the budget that way). Load mode
    and huge pages counted as memory-neutral, so the boundary of their pinned twins was the unpinned one: 27 layers,
    "measured to fit" at the unpinned peak, while 26 fit pinned; it came only from the exploration (trial 7). On an H100
    at 1195ee8 the same key printed a huge-page trial's peak as its pinned twins' prediction. Pinned knob values get
    their own boundary: 26 layers, and every share called measured to fit fits."""
    rows, budget = _host_buffers_rows(tmp_path)
    study = _table_sweep(tmp_path, rows, trials=6, constraints={"vram_mib": budget})
    measured = [t for t in Store(study).records() if not t.unmeasured]
    said = [(t.number, t.params, t.vram_peak_mib, t.search_reason) for t in measured]
    unpinned = [TrialConfig.from_params(t.config).host_weights_unpinned() for t in measured]
    assert unpinned[0] and measured[0].params["cpu_expert_layers"] == 27, said
    pinned = [t for t, u in zip(measured, unpinned) if not u]
    assert pinned and pinned[0].params["cpu_expert_layers"] == 26 and pinned[0].vram_peak_mib <= budget, said
    assert all(t.vram_peak_mib <= budget for t in measured if "measured to fit" in str(t.search_reason)), said
