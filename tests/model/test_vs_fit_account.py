"""The vs-fit benchmark's measured account (benchmarks/vs_fit.py): the host's cost per GB is read from measurements
that left different expert bytes in RAM, and where they all read about the same (one budget's sweep ends on one
placement) the account says it cannot tell, instead of printing the fit's arbitrary split as a gain."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoinfer.engines.base import TrialConfig
from autoinfer.model.performance import features_of
from autoinfer.model.shape import shape_from_gguf

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _config(model: Path, layers: int, threads: int = 2) -> TrialConfig:
    return TrialConfig.from_params({"model": str(model), "n_gpu_layers": 99, "placement": "last",
                                    "cpu_expert_layers": layers, "threads": threads})


def _account(monkeypatch, model: Path, layer_counts: list[int]):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import measured_account

    shape = shape_from_gguf(model)
    # tg from a host that spends 20 ms per GB of experts in RAM and 4 ms per GB on the GPU
    observations = []
    for layers in layer_counts:
        for threads in (1, 2):
            config = _config(model, layers, threads)
            f = features_of(shape, config)
            observations.append((config, 1 / (0.02 * f.cpu_gb + 0.004 * f.gpu_gb + 1e-4)))
    answers = {8192.0: {"fit": observations[-1]}}  # the most experts in RAM
    return measured_account(model, observations, answers, {8192.0: 8191.0})


def test_the_host_cost_is_read_where_the_measurements_span_host_bytes(monkeypatch, tiny_model):
    lines, data = _account(monkeypatch, tiny_model, [0, 1, 2])
    assert data["host_cost_identified"] and data["host_gb_span"] > 1
    assert data["8192-fit"]["fewer_host_bytes"] > data["8192-fit"]["model"]
    assert not any("not identified" in line for line in lines)
    assert data["8192-fit"]["slack_mib"] == 1 and data["8192-fit"]["slack_filled_gain"] > 0
    assert lines[-1].startswith("| 8192 | 8191 | 1 | +")
    from vs_fit import TARGET, host_room  # the host knobs' part, from the coefficients the account fitted

    cut = host_room(np.array(list(data["coef"].values())), features_of(shape_from_gguf(tiny_model),
                                                                       _config(tiny_model, 2, 2)), TARGET)
    assert data["8192-fit"]["host_time_cut_for_target"] == cut
    assert lines[-1].endswith("| unreachable: more than all of it |" if cut is None else f"| {cut:.1%} |")


def test_the_room_placement_has_left_is_the_host_cost_less_the_gpu_cost_per_byte_moved(monkeypatch, tiny_model):
    """20 ms per GB the host reads, 4 on the GPU: a 1.15x faster placement must move (s - s/1.15) / 16 ms of read GB
    per token to the GPU, which is that divided by the host's read share resident, less the budget's slack."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import GB, MIB, placement_room

    f = features_of(shape_from_gguf(tiny_model), _config(tiny_model, 2))
    coef = np.array([0.0, 0.02, 0.0, 0.0, 0.004, 0.0])
    seconds = 0.02 * f.cpu_gb + 0.004 * f.gpu_gb
    share = f.cpu_gb / f.cpu_total_gb
    filled, beyond = placement_room(coef, f, 0.25, 1.15)
    assert beyond == pytest.approx((seconds - seconds / 1.15) / 0.016 / share * GB / MIB - 0.25)
    assert filled == pytest.approx(seconds / (seconds - 0.016 * 0.25 * MIB / GB * share) - 1)
    assert placement_room(coef, f, 0.25, 10.0)[1] is None  # more than every host byte on the GPU
    assert placement_room(coef, f, 1000.0, 1.15)[0] == pytest.approx(seconds / (seconds - 0.016 * f.cpu_gb) - 1)


def test_the_host_knobs_part_is_the_share_of_the_host_seconds_a_faster_answer_must_cut(monkeypatch, tiny_model):
    """20 ms per GB the host reads, 4 on the GPU: at the same placement a 1.15x faster answer must cut s - s/1.15 from
    the host's 20 ms x host GB; where that is more than the host spends, no host knob can give it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import host_room

    f = features_of(shape_from_gguf(tiny_model), _config(tiny_model, 2))
    coef = np.array([0.0, 0.02, 0.0, 0.0, 0.004, 0.0])
    seconds = 0.02 * f.cpu_gb + 0.004 * f.gpu_gb
    assert host_room(coef, f, 1.15) == pytest.approx((seconds - seconds / 1.15) / (0.02 * f.cpu_gb))
    assert host_room(coef, f, 1 / (1 - 0.02 * f.cpu_gb / seconds) * 1.01) is None  # past every host second
    threaded = np.array([0.0, 0.01, 0.02, 0.001, 0.004, 0.0])  # the cost per GB at the configuration's threads
    per_gb = 0.01 + 0.02 / f.threads + 0.001 * f.threads
    total = per_gb * f.cpu_gb + 0.004 * f.gpu_gb
    assert host_room(threaded, f, 1.15) == pytest.approx((total - total / 1.15) / (per_gb * f.cpu_gb))


def test_measurements_of_one_placement_leave_the_host_cost_unidentified(monkeypatch, tiny_model):
    lines, data = _account(monkeypatch, tiny_model, [1])
    assert not data["host_cost_identified"] and data["host_gb_span"] == 0
    assert data["8192-fit"]["fewer_host_bytes"] is None
    assert any("too alike to tell the host's cost" in line for line in lines)
    assert lines[-1].endswith("| not identified |")
    assert "host_time_cut_for_target" not in data["8192-fit"]


def test_the_evidence_keeps_each_sweep_trial_as_it_ran(monkeypatch, tiny_model):
    """A vs-fit record names every sweep trial with the huge pages that ran and how much of the process got them, so
    the evidence says which huge-pages configurations were measured."""
    from optuna.trial import TrialState

    from autoinfer.store.records import TrialRecord

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import trial_summary

    ran = TrialConfig(tiny_model, load_mode="none", extra=(("huge_pages", 1),))
    t = TrialRecord(4, TrialState.COMPLETE, values=(10.0,), params={"load_mode": "none", "huge_pages": 1},
                    config=ran.to_params(), outcome="ok", tg_samples=(9.0, 11.0, 10.5), pp_samples=(100.0,),
                    vram_peak_mib=8000.0, metrics={"huge_pages_mib": 3798.0}, search_reason="a move")
    summary = trial_summary(t)
    assert summary["params"] == {"load_mode": "none", "huge_pages": 1} and summary["huge_pages_mib"] == 3798.0
    assert (summary["tg_median"], summary["pp_median"], summary["number"]) == (10.5, 100.0, 4)
    assert summary["feasible"] and summary["state"] == "COMPLETE"


def test_fits_answer_is_modelled_at_the_threads_llama_cpp_gives_it(monkeypatch, tiny_model):
    """fit's answers run without -t, so llama.cpp takes one thread per physical core; the account models them so,
    not at the performance model's generic default."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import as_ran

    monkeypatch.setattr("vs_fit.llama_defaults", lambda: {"threads": 16})
    assert as_ran(TrialConfig(tiny_model)).threads == 16
    assert as_ran(TrialConfig(tiny_model, threads=6)).threads == 6



def test_vs_fit_takes_budgets_with_commas_or_spaces_and_refuses_others_in_one_line(monkeypatch, capsys):
    """gpu_evidence.sh's other steps take BUDGETS separated by spaces; vs_fit.py takes both, and a word that is not a
    budget is a usage error (exit 2) before any GPU is looked for."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from vs_fit import budget_list, main

    assert budget_list("8192 12288") == budget_list("8192,12288") == [8192.0, 12288.0]
    for bad in ("8192 x", "", "0"):
        with pytest.raises(SystemExit) as exc:
            main(["--model", "m.gguf", "--out", "o", "--budgets", bad])
        assert exc.value.code == 2
        assert "--budgets" in capsys.readouterr().err.splitlines()[-1]


def test_each_round_is_kept_as_it_ends_and_a_cut_budget_stays_out_of_the_tables(monkeypatch, llama_tools, tiny_model,
                                                                                 tmp_path, capsys):
    """Where the device time ends during the interleaved rounds (at 12 GiB on an H100, after a finished sweep), the
    sweep and the rounds run stay in the result file, marked cut; vs_fit_rounds.py names such a budget and leaves it
    out of its tables and its pooled ratio."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("AUTOINFER_LLAMA_BIN", str(llama_tools.bin_dir))
    import vs_fit_rounds
    from vs_fit import interleave

    config = TrialConfig.from_params({"model": str(tiny_model), "n_gpu_layers": 0, "threads": 1, "n_prompt": 16,
                                      "n_gen": 4, "repetitions": 1})
    kept = []
    runs = interleave(config, config, 2, after_round=lambda so_far: kept.append(len(so_far["ours"]["tg"])))
    assert kept == [0, 1, 2] and len(runs["fit"]["tg"]) == 2 and min(runs["fit"]["tg"] + runs["ours"]["tg"]) > 0

    stored = json.loads((BENCHMARKS / "results" / "vs-fit-h100-d879220.json").read_text())[0]
    cut = {**stored, "budget_mib": 12288.0, "runs": runs, "cut": "2 of 5 rounds run when this was written"}
    path = tmp_path / "vs-fit-cut.json"
    path.write_text(json.dumps([stored, cut]))
    assert vs_fit_rounds.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| vs-fit-cut.json | 16384 |" in out and "| vs-fit-cut.json | 12288 |" not in out
    assert "| 12288 |" not in out and "| all | 1 |" in out
    assert out.strip().splitlines()[-1] == ("Left out, cut before their rounds ended: vs-fit-cut.json at 12288 MiB "
                                            "(2 of 5 rounds run when this was written).")
