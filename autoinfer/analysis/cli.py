"""`autoinfer analyze` and `autoinfer import`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from autoinfer.sweep.cli import StorageOpt, StudyOpt


def register(app: typer.Typer) -> None:
    app.command()(analyze)
    app.command(name="import")(import_files)


def analyze(
    study: Optional[str] = StudyOpt,
    storage: Optional[str] = StorageOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default: results/<study>/report/)."),
    cpu_bw: Optional[float] = typer.Option(None, "--cpu-bw", min=0, help="Measured host memory bandwidth, GB/s."),
    gpu_bw: Optional[float] = typer.Option(None, "--gpu-bw", min=0, help="Measured device memory bandwidth, GB/s."),
    compare: List[str] = typer.Option([], "--compare", help="Another study of the same campaign on other hardware "
                                                            "(repeatable): adds a hardware-class comparison."),
) -> None:
    """Tables, fits, figures and a readable report (report.md / report.html) for a study."""
    import optuna
    import pandas as pd

    from autoinfer.analysis.report import analyze as run_analysis
    from autoinfer.analysis.report import no_answer, winner_sentence
    from autoinfer.paths import results_dir
    from autoinfer.store.trials import load_study
    from autoinfer.sweep.diagnosis import diagnose

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = load_study(study, storage)
    failed = diagnose(loaded)
    if failed is not None:  # the report still shows what was tried; the line says why there is no answer
        Console(stderr=True).print(f"no recommendation: {failed.line()}", soft_wrap=True, markup=False)
    folder = out or results_dir() / loaded.study_name / "report"
    others = [load_study(name, storage) for name in compare]
    result = run_analysis(loaded, folder, cpu_bw=cpu_bw, gpu_bw=gpu_bw, compare_with=others)
    console = Console()
    rec = result.recommendation  # the answer `sweep`, `status`, `export` and the report give, not a top median
    if rec is not None:
        console.print(rec.headline(), markup=False, soft_wrap=True)
    elif failed is None:  # diagnose has said nothing: trials succeeded, none within the constraints or trusted
        console.print(f"no recommendation: {no_answer(result.frame)}", markup=False, soft_wrap=True)
    console.print(winner_sentence(result.fitset))
    if result.classes is not None:
        for _, row in result.classes.classes.iterrows():
            shown = f"{row['median']:.2f} tok/s" if pd.notna(row.get("median")) else "no successful trial"
            console.print(f"class {row['hardware_class']} ({row['description']}): best {shown}", markup=False)
    console.print(f"report: {folder / 'report.html'}")


def import_files(
    files: List[Path] = typer.Argument(..., help="llama-bench JSON/JSONL, a CSV, or seed-study TSV/JSONL files."),
    study: str = typer.Option(..., "--study", help="Study to add the rows to (created if missing)."),
    storage: Optional[str] = StorageOpt,
) -> None:
    """Bring outside measurements into a study, one trial per row, so `analyze` runs on them."""
    import optuna

    from autoinfer.analysis.dataset import add_to_study
    from autoinfer.analysis.importers import read_files
    from autoinfer.store.trials import storage_for

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = read_files(files)
    console = Console()
    for res in results:
        console.print(f"{res.path}: {len(res.rows)} rows ({res.kind}), {len(res.junk)} junk lines skipped")
        for j in res.junk:
            console.print(f"  line {j.source_line}: {j.reason}", markup=False)
    target = optuna.create_study(study_name=study, storage=storage_for(storage), direction="maximize",
                                 load_if_exists=True)
    summary = add_to_study(results, target)
    console.print(f"study {summary.study}: {summary.added} trials added, "
                  f"{summary.skipped_duplicates} already there")
