"""The quantization ladder and per-file quality: real llama-quantize/llama-perplexity on the tiny model, fixtures
for the output parsers, and the campaign keys that use quality (max_kld, objective kld)."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from gguf import GGUFReader
from typer.testing import CliRunner

from autoinfer.campaign.spec import parse_campaign
from autoinfer.cli import app
from autoinfer.errors import UserError
from autoinfer.llama.binaries import Tools
from autoinfer.llama.quality import (
    DEFAULT_CORPUS,
    QualitySettings,
    load_quality,
    measure_quality,
    parse_kld,
    parse_reference_ppl,
    reference_of,
)
from autoinfer.llama.quantize import (
    build_ladder,
    file_sha256,
    parse_types,
    weight_types,
)
from autoinfer.model.synth import cached_model

FIXTURES = Path(__file__).parent / "fixtures" / "perplexity"
LADDER = ("Q8_0", "Q4_K_M", "Q2_K")
SETTINGS = QualitySettings(ctx=128, chunks=4, threads=2)


@pytest.fixture(scope="module")
def f16_model() -> Path:
    return cached_model("tiny", "F16", tokenizer="qwen35")


@pytest.fixture(scope="module")
def ladder(llama_tools, f16_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder with space")
    return build_ladder(f16_model, LADDER, out_dir=out, threads=2, tools=llama_tools)


def test_parsers_read_llama_perplexity_output():
    assert parse_reference_ppl((FIXTURES / "base_run.txt").read_text()) == (153365.3688, 682.22361)
    q = parse_kld((FIXTURES / "kld_run.txt").read_text())
    assert (q["kld"], q["kld_err"]) == (0.000493, 0.000003)
    assert (q["ppl"], q["reference_ppl"], q["same_top_p"]) == (153062.967648, 153365.359235, 39.286)
    with pytest.raises(ValueError, match="KLD"):
        parse_kld("====== Perplexity statistics ======\nMean PPL(Q) : 1.0 ± 0.1\nMean PPL(base) : 1.0 ± 0.1\n")
    with pytest.raises(ValueError, match="Final estimate"):
        parse_reference_ppl("[1]12.5,[2]13.1,")  # a run cut short before its summary


def _losing_perplexity(folder: Path, found_on: int | None) -> Tools:
    """A stand-in llama-perplexity that exits 0 without its summary, as llama.cpp's log thread lets the real one do
    (about one run in three on the tiny model), until its `found_on`-th run (None: never)."""
    runs = folder / "runs"
    script = folder / "llama-perplexity"
    script.write_text(f"""#!/bin/sh
n=$(( $(cat "{runs}" 2>/dev/null || echo 0) + 1 )); echo $n > "{runs}"
echo "[1]12.5,[2]13.1,"
if [ $n -ge {found_on or 10**6} ]; then cat "{FIXTURES / "base_run.txt"}"; fi
""")
    script.chmod(0o755)
    return Tools(bin_dir=folder, lib_dir=None, commit="stand-in", flags=(), cuda=False)


@pytest.mark.parametrize("found_on", [7, None])
def test_a_run_that_loses_its_summary_is_run_again(tmp_path, monkeypatch, f16_model, found_on):
    monkeypatch.setenv("AUTOINFER_CACHE", str(tmp_path / "cache"))  # the stand-in's numbers stay out of the cache
    model = Path(shutil.copy(f16_model, tmp_path / "model.gguf"))
    tools = _losing_perplexity(tmp_path, found_on)
    if found_on:
        measured = measure_quality([model], SETTINGS, tools=tools)
        assert measured[model.resolve()].ppl == 153365.3688
        assert (tmp_path / "runs").read_text().strip() == str(found_on)
    else:
        with pytest.raises(UserError, match="llama-perplexity on model.gguf: .*Final estimate"):
            measure_quality([model], SETTINGS, tools=tools)


def test_type_names_are_checked():
    known = ("Q8_0", "Q4_K_M", "IQ2_XXS")
    assert parse_types("q8_0, Q4_K_M,Q8_0", known) == ("Q8_0", "Q4_K_M")
    with pytest.raises(UserError, match="unknown quantization type 'Q9_K'"):
        parse_types("Q8_0,Q9_K", known)
    with pytest.raises(UserError, match="empty"):
        parse_types(" , ", known)


def test_ladder_is_built_once_and_shrinks(llama_tools, f16_model, ladder):
    assert [r.qtype for r in ladder] == list(LADDER)
    assert all(r.built and r.path.is_file() for r in ladder)
    sizes = [f16_model.stat().st_size, *(r.n_bytes for r in ladder)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    again = build_ladder(f16_model, LADDER, out_dir=ladder[0].path.parent, tools=llama_tools)
    assert [r.built for r in again] == [False] * len(LADDER)
    assert [r.path for r in again] == [r.path for r in ladder]


def test_types_needing_an_imatrix_and_quantized_sources_are_refused(llama_tools, f16_model, ladder, tmp_path):
    with pytest.raises(UserError, match="IQ2_XXS need an importance matrix: pass --imatrix auto"):
        build_ladder(f16_model, ("Q8_0", "IQ2_XXS"), out_dir=tmp_path, tools=llama_tools)
    with pytest.raises(UserError, match="does not exist; pass an existing file, or --imatrix auto"):
        build_ladder(f16_model, ("IQ2_XXS",), out_dir=tmp_path, imatrix=tmp_path / "auto", tools=llama_tools)
    with pytest.raises(UserError, match="has no tokenizer, so llama-imatrix cannot read the corpus"):
        build_ladder(cached_model("tiny", "F16", tokenizer="none"), ("IQ2_XXS",), out_dir=tmp_path, imatrix="auto",
                     tools=llama_tools)
    assert not list(tmp_path.iterdir())  # checked before anything was written
    with pytest.raises(UserError, match="already holds quantized weights"):
        build_ladder(ladder[0].path, ("Q4_K_M",), out_dir=tmp_path, tools=llama_tools)


def test_auto_imatrix_is_made_once_and_used_for_the_types_that_need_one(llama_tools, f16_model, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("AUTOINFER_CACHE", str(tmp_path / "cache"))  # a fresh cache: the real llama-imatrix runs
    plain, low = build_ladder(f16_model, ("Q4_K_M", "IQ2_XXS"), imatrix="auto", threads=2, tools=llama_tools)
    matrix = low.imatrix
    assert plain.imatrix is None and "-im" not in plain.path.parent.name  # the file a ladder without it makes
    assert matrix.parent == tmp_path / "cache" / "imatrix"
    assert matrix.name.startswith(f"{file_sha256(f16_model)[:16]}-{file_sha256(DEFAULT_CORPUS)[:16]}-")
    fields = GGUFReader(str(matrix)).fields
    assert fields["general.type"].contents() == "imatrix"
    assert fields["imatrix.datasets"].contents() == [str(DEFAULT_CORPUS)] and fields["imatrix.chunk_count"].contents() > 1
    assert low.built and low.path.parent.name.endswith(f"-im{file_sha256(matrix)[:8]}")
    assert "IQ2_XXS" in weight_types(low.path)
    made_at = matrix.stat().st_mtime_ns
    again = build_ladder(f16_model, ("Q4_K_M", "IQ2_XXS"), imatrix="auto", tools=llama_tools)
    assert [(r.path, r.built, r.imatrix) for r in again] == [(plain.path, False, None), (low.path, False, matrix)]
    assert matrix.stat().st_mtime_ns == made_at  # cached by (model hash, corpus hash), not made again
    measured = measure_quality([f16_model, plain.path, low.path], SETTINGS, tools=llama_tools)
    assert 0 < measured[plain.path].kld < measured[low.path].kld  # 2 bits cost more than 4.5, even calibrated

    cli = CliRunner().invoke(app, ["model", "quantize", str(f16_model), "--types", "IQ2_XXS,Q4_K_M", "--imatrix",
                                   "auto", "--no-quality", "--llama-bin", str(llama_tools.bin_dir)])
    assert cli.exit_code == 0, cli.output
    assert f"importance matrix for IQ2_XXS: {matrix}" in cli.output.replace("\n", "") and "cached" in cli.output


def test_kld_grows_as_precision_drops(llama_tools, f16_model, ladder):
    files = [f16_model, *(r.path for r in ladder)]
    assert reference_of(files) == f16_model
    measured = measure_quality(files, SETTINGS, tools=llama_tools, force=True)
    klds = [measured[Path(f).resolve()].kld for f in files]
    assert klds[0] == 0.0 and all(k > 0 for k in klds[1:])
    assert klds == sorted(klds) and len(set(klds)) == len(klds), klds  # F16 < Q8_0 < Q4_K_M < Q2_K
    errors = [measured[Path(f).resolve()].kld_err for f in files[1:]]
    assert all(k > 3 * e for k, e in zip(klds[1:], errors))  # the ordering is outside the error bars
    stored = load_quality(ladder[-1].path, measured[ladder[-1].path].key)
    assert stored == measured[ladder[-1].path]
    cached = measure_quality(files, SETTINGS, tools=llama_tools)
    assert cached == measured


def test_quality_campaign_keys_are_validated():
    c = parse_campaign({"name": "q", "model": ["a.gguf", "b.gguf"], "objective": {"tg": 1, "kld": 5},
                        "constraints": {"max_kld": 0.05}, "quality": {"ctx": 128, "chunks": 4}})
    assert c.objective_weights() == {"tg": 1.0, "kld": 5.0}
    for bad, key in (({"constraints": {"max_kld": -1}}, "constraints.max_kld"),
                     ({"objective": {"kld": 1}}, "objective"),
                     ({"quality": {"ctx": 8}}, "quality.ctx"),
                     ({"quality": {"corpus_file": "x"}}, "quality.corpus_file")):
        with pytest.raises(UserError, match=key.replace(".", r"\.")):
            parse_campaign({"name": "q", "model": "a.gguf", **bad})


def test_sweep_marks_files_over_max_kld_infeasible(llama_tools, f16_model, ladder, monkeypatch):
    from autoinfer.sweep.runner import sweep

    monkeypatch.setenv("AUTOINFER_LLAMA_BIN", str(llama_tools.bin_dir))
    files = [str(r.path) for r in ladder]
    measured = measure_quality([f16_model, *files], SETTINGS, tools=llama_tools)
    limit = (measured[ladder[1].path].kld + measured[ladder[2].path].kld) / 2  # Q2_K is over, the others under
    campaign = parse_campaign({
        "name": "kld", "engine": "llama-bench", "model": files,
        "space": {"n_gpu_layers": 0, "threads": 2},
        "constraints": {"max_kld": limit}, "quality": {"reference": str(f16_model), "ctx": 128, "chunks": 4},
        "objective": {"tg": 1, "kld": 2},
        "measure": {"n_prompt": 16, "n_gen": 4, "repetitions": 1, "timeout_s": 120},
        "budget": {"trials": 3}, "sampler": {"name": "random", "seed": 1},
        "search": {"informed": False, "fit_params": False, "skip_predicted": False},
        "confirm": {"enabled": False}, "drift": {"every": None}, "idle": {"policy": "off"},
    })
    result = sweep(campaign, progress=False)
    trials = result.study.get_trials(deepcopy=False)
    by_file = {}
    for t in trials:
        if "repeat_of" not in t.user_attrs:  # a repeat was answered from its earlier trial, not measured
            by_file.setdefault(t.user_attrs["config"]["model"], []).append(t)
    assert any(measured[Path(p)].kld > limit for p in by_file), "the sampler never tried the file over max_kld"
    assert any(measured[Path(p)].kld <= limit for p in by_file)
    for path, ts in by_file.items():
        q = measured[Path(path)]
        for t in ts:
            assert t.user_attrs["kld"] == q.kld and t.user_attrs["ppl"] == q.ppl
            assert t.constraints["kld"] == pytest.approx(q.kld - limit)
            assert "memory" not in t.constraints  # over max_kld is a quality verdict, not a memory one
            if q.kld > limit:
                assert t.user_attrs["outcome"] == "infeasible" and "max_kld" in t.user_attrs["reason"]
            elif t.state == optuna.trial.TrialState.COMPLETE:
                assert t.user_attrs["outcome"] == "ok"
    if result.best is not None:
        assert result.best.trial.kld <= limit
