"""Importers on every file of the seed study's data, on real llama-bench output, and on a generic CSV."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

from autoinfer.analysis.dataset import add_to_study, config_table, load_frame
from autoinfer.analysis.importers import read_file, read_folder
from autoinfer.engines.base import Outcome
from autoinfer.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures"

# Every file in shared/peer-data: (kind, rows, junk lines) or the reason it is refused (PROVENANCE.txt).
EXPECTED = {
    "qwen35-moe-offload/experiments_p4v2.jsonl": ("seed-jsonl", 48, 0),
    "qwen35-moe-offload/phase3-real-inference/results_phase3.tsv": ("seed-tsv", 10, 0),
    "qwen35-moe-offload/results_phase4.tsv": ("seed-tsv", 59, 0),
    "qwen35-moe-offload/results_phase5.tsv": ("seed-tsv", 122, 3),  # llama-cpp-python stderr fragments
    "qwen35-moe-offload/results_phase6.tsv": ("seed-tsv", 171, 0),
    "qwen35-moe-offload/results_phase8.tsv": ("seed-tsv", 54, 2),  # stderr fragments
    "qwen35-moe-offload/results_phase9.tsv": ("seed-tsv", 91, 3),  # empty tok_s
    "qwen35-moe-offload/results_phase10.tsv": ("seed-tsv", 49, 0),
    "qwen35-moe-offload/results_phase11.tsv": ("seed-tsv", 60, 0),  # rows 30, 45 repaired (literal \t)
    "qwen35-moe-offload/results_phase12.tsv": ("seed-tsv", 72, 0),  # wrong header, 13-column rows
    "PROVENANCE.txt": "a text file",
    "qwen35-moe-offload/phase5_log.txt": "a run log",
    "qwen35-moe-offload/phase5_log2.txt": "a run log",
    "qwen35-moe-offload/phase8_log.txt": "a run log",
    "qwen35-moe-offload/results_phase7.tsv": "KV-compression micro-benchmarks",
    "qwen35-moe-offload/autoresearch-mar25/results.tsv": "SIMULATION",
    "qwen35-moe-offload/autoresearch-ram-offload/results.tsv": "SIMULATION",
    "qwen35-moe-offload/results/polarquant_20260326_233758.json": "without llama-bench records",
    "qwen35-moe-offload/results/qjl_20260326_233849.json": "without llama-bench records",
    "autoinfer/scripts/autoresearch_results.json": "derived summary",
    "autoinfer/scripts/bayesian_predictions.json": "derived summary",
    **{f"autoinfer/configs/{n}.json": "hand-written recommended configuration"
       for n in ("cpu_only_32gb", "m1_pro_16gb", "m2_max_32gb", "rtx3070_8gb", "rtx3080_10gb", "rtx3090_24gb",
                 "rtx4070ti_12gb")},
}


@pytest.fixture(scope="module")
def seed_study(peer):
    results, _ = read_folder(peer)
    study = optuna.create_study(study_name="seed", direction="maximize")
    add_to_study(results, study)
    return study


def test_every_peer_data_file_is_imported_or_refused_with_a_reason(peer):
    files = {str(p.relative_to(peer)) for p in peer.rglob("*") if p.is_file()}
    assert files == set(EXPECTED), "a file was added to or removed from shared/peer-data: update EXPECTED"
    for rel, expected in EXPECTED.items():
        path = peer / rel
        if isinstance(expected, str):
            with pytest.raises(UserError, match=expected):
                read_file(path)
            continue
        result = read_file(path)
        assert (result.kind, len(result.rows), len(result.junk)) == expected, rel
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        data_lines = len(lines) - (1 if path.suffix == ".tsv" else 0)
        assert len(result.rows) + len(result.junk) == data_lines, f"{rel}: a line was neither imported nor reported"
        for row in result.rows:
            assert row.source_file == str(path) and row.source_line >= 1
            assert row.env["gpu_name"] == "NVIDIA GeForce RTX 3070"


def test_junk_rows_carry_their_reason(peer):
    phase5 = read_file(peer / "qwen35-moe-offload/results_phase5.tsv")
    assert [j.source_line for j in phase5.junk] == [73, 76, 78]
    assert all("not a result row" in j.reason for j in phase5.junk)
    phase9 = read_file(peer / "qwen35-moe-offload/results_phase9.tsv")
    assert {j.reason for j in phase9.junk} == {"no tok/s value"}


def test_drifting_schemas_are_read_by_row_width(peer):
    phase12 = read_file(peer / "qwen35-moe-offload/results_phase12.tsv")
    first = phase12.rows[0]  # "1 27.559 7595 256 q8_0 q8_0 True 26 32 16 p12_iq2xxs_gpu26_b32 ok ..."
    assert first.tg_samples == (27.559,) and first.vram_peak_mib == 7595
    assert first.params["n_gpu_layers"] == 26 and first.params["batch"] == 32 and first.params["ubatch"] == 16
    assert first.params["quant"] == "IQ2_XXS" and first.params["n_ctx"] == 256
    phase11 = read_file(peer / "qwen35-moe-offload/results_phase11.tsv")
    repaired = [r for r in phase11.rows if "repaired" in r.reason]
    assert [r.source_line for r in repaired] == [31, 46]
    assert {r.outcome for r in repaired} == {Outcome.CRASH}
    outcomes = Counter(r.outcome for r in read_file(peer / "qwen35-moe-offload/results_phase10.tsv").rows)
    assert outcomes == {Outcome.OK: 47, Outcome.OOM: 1, Outcome.LOAD_FAILED: 1}


def test_seed_headline_is_the_maximum_of_17_replicates(seed_study):
    configs = config_table(load_frame(seed_study))
    best = configs.iloc[0]
    assert best["n"] == 17 and best["trials"] == 17
    assert best["max"] == pytest.approx(29.899)
    assert best["mean"] == pytest.approx(28.669, abs=1e-3)
    assert best["median"] == pytest.approx(29.124)


def test_import_into_a_stored_study_is_idempotent(peer, tmp_path):
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    files = [peer / "qwen35-moe-offload/results_phase12.tsv", peer / "qwen35-moe-offload/results_phase9.tsv"]
    cmd = [sys.executable, "-c", "from autoinfer.cli import main; main()", "import", *map(str, files),
           "--study", "s", "--storage", storage]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "163 trials added" in first.stdout and "line 27: no tok/s value" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True)
    assert "0 trials added, 163 already there" in second.stdout
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) == 163
    t = study.trials[0]
    assert t.user_attrs["source_file"] == str(files[0]) and t.user_attrs["source_line"] == 2
    assert t.user_attrs["outcome"] == "ok" and t.user_attrs["tg_samples"] == [27.559]
    assert study.user_attrs["import_junk"][0]["reason"] == "no tok/s value"


def test_import_of_a_log_is_a_one_line_error(peer):
    cmd = [sys.executable, "-c", "from autoinfer.cli import main; main()", "import",
           str(peer / "qwen35-moe-offload/phase5_log.txt"), "--study", "x"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "a run log, not a results table" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_real_llama_bench_output_imports(llama_tools, tiny_model, tmp_path, fmt):
    argv = [str(llama_tools.tool("llama-bench")), "-m", str(tiny_model), "-p", "16", "-n", "4", "-r", "2",
            "-t", "1", "-ngl", "0", "-ncmoe", "0,1", "-o", fmt]
    env = {**os.environ, **llama_tools.env()}
    if llama_tools.lib_dir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(llama_tools.lib_dir), env.get("LD_LIBRARY_PATH"))
                                                 if p)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, shlex.join(argv) + "\n" + done.stderr[-2000:]
    out = tmp_path / f"bench.{fmt}"
    out.write_text(done.stdout)
    result = read_file(out)
    assert result.kind == "llama-bench" and not result.junk
    assert [r.params["n_cpu_moe"] for r in result.rows] == [0, 1]
    for row in result.rows:
        assert len(row.tg_samples) == 2 and len(row.pp_samples) == 2  # pp and tg records merged per config
        assert row.params["model"] == str(tiny_model) and row.params["threads"] == 1
        assert row.env["build_commit"] == llama_tools.commit[: len(row.env["build_commit"])]
    study = optuna.create_study(direction="maximize")
    add_to_study([result], study)
    assert [t.params for t in study.trials] == [{"n_cpu_moe": 0}, {"n_cpu_moe": 1}]


def test_old_llama_bench_json_edge_cases():
    result = read_file(FIXTURES / "llama-bench-old-build.json")
    assert len(result.rows) == 1
    row = result.rows[0]
    assert row.tg_samples == (20.1, 20.5, 20.9)
    assert row.params["load_mode"] == "none" and row.params["flash_attn"] == "on"
    assert row.params["override_tensors"] == []
    reasons = sorted(j.reason for j in result.junk)
    assert reasons[0].startswith("combined prompt+generation test (-pg)")
    assert reasons[1] == "not a llama-bench record (missing samples_ts)"


def test_generic_csv(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("n_gpu_layers,n_cpu_moe,threads,tg,pp,vram_mib,outcome\n"
                    "99,4,8,30.1;31.0;29.5,500,7000,ok\n"
                    "99,0,8,,,,oom\n"
                    "99,2,8,fast,,6000,ok\n"
                    "99,2\n")
    result = read_file(path)
    assert [r.source_line for r in result.rows] == [2, 3]
    assert result.rows[0].tg_samples == (30.1, 31.0, 29.5) and result.rows[0].params["n_cpu_moe"] == 4
    assert result.rows[1].outcome is Outcome.OOM
    assert [(j.source_line, j.reason.split(" ")[0]) for j in result.junk] == [(4, "tg/pp"), (5, "2")]
    study = optuna.create_study(direction="maximize")
    add_to_study([result], study)
    assert study.trials[1].state == optuna.trial.TrialState.PRUNED and study.trials[1].constraints == {"memory": 1.0}


def test_csv_without_speed_columns_is_refused(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="no tg or pp column"):
        read_file(path)


def test_project_table_brings_its_sidecars(tmp_path):
    """A table benchmarks/make_table.py wrote on a GPU machine (the measured H100 table) is analysed here without
    its GGUF: the .meta.json's fixed parameters go into every row and the .shape.json places the weights."""
    table = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "h100-35b-four-knobs.csv"
    result = read_file(table)
    params = result.rows[0].params
    assert (params["placement"], params["n_gpu_layers"], params["flash_attn"], params["n_gen"]) == ("last", 99, "on", 32)
    assert params["model"].endswith("h100-35b-four-knobs.shape.json")
    study = optuna.create_study(direction="maximize")
    add_to_study([result], study)
    frame = load_frame(study)
    by_layers = frame.groupby("cpu_expert_layers")["cpu_gb"].first()
    assert by_layers.notna().all() and by_layers.is_monotonic_increasing and by_layers.iloc[0] > 0
    shape = json.loads(table.with_name("h100-35b-four-knobs.shape.json").read_text())
    experts_of_one_layer = sum(t["n_bytes"] for t in shape["tensors"] if t["layer"] == 0
                               and t["group"] == "routed_experts") / 1e9
    assert by_layers[8] - by_layers[4] == pytest.approx(4 * experts_of_one_layer, rel=0.02)


def test_a_broken_table_sidecar_is_a_one_line_error(tmp_path):
    (tmp_path / "t.csv").write_text("threads,tg,pp\n8,30,500\n")
    (tmp_path / "t.meta.json").write_text("{fixed: ")
    with pytest.raises(UserError, match=r"t\.meta\.json: not valid JSON"):
        read_file(tmp_path / "t.csv")
    for wrong in ("[1, 2]", '{"fixed": "threads=8"}'):
        (tmp_path / "t.meta.json").write_text(wrong)
        with pytest.raises(UserError, match=r"t\.meta\.json: expected an object"):
            read_file(tmp_path / "t.csv")
    (tmp_path / "t.meta.json").unlink()
    assert read_file(tmp_path / "t.csv").rows[0].params == {"threads": 8}
