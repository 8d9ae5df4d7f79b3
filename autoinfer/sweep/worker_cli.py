"""`autoinfer worker`: join a campaign stored on a shared (PostgreSQL) storage, from any machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from autoinfer.errors import UserError
from autoinfer.paths import STORAGE_ENV
from autoinfer.store.redact import redact_url


def register(app: typer.Typer) -> None:
    app.command()(worker)


def worker(
    campaign_file: Optional[Path] = typer.Argument(None, help="Campaign YAML; needed only to create the study."),
    study: str = typer.Option(..., "--study", help="Study to join."),
    storage: str = typer.Option(..., "--storage", envvar=STORAGE_ENV, show_envvar=True,
                                help="Shared storage URL: postgresql://USER@HOST/DB (or set the environment "
                                "variable, which keeps its password off the process list)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="One worker per GPU, e.g. 0,1, or per group of GPUs, "
                                       "e.g. 0+1,2+3 (sets CUDA_VISIBLE_DEVICES for each)."),
    quiet: bool = typer.Option(False, "--quiet", help="No live display."),
) -> None:
    """Run trials of a study until its budget is spent; start as many workers as machines (or GPUs) you have."""
    from autoinfer.coordination import worker as shared
    from autoinfer.store.urls import check_url, is_shared

    os.environ.pop(STORAGE_ENV, None)  # read once; trial processes started from here do not inherit it
    check_url(storage)
    if gpus is not None:
        items = shared.parse_gpus(gpus)
        if len(items) > 1 and not is_shared(storage):
            raise UserError(f"--gpus {gpus} starts {len(items)} workers, but {redact_url(storage)} allows one worker per study; "
                            "use a PostgreSQL storage (README: Several machines)")
        args = [str(campaign_file)] if campaign_file else []
        args += ["--study", study] + (["--quiet"] if quiet or len(items) > 1 else [])
        code = shared.start_per_gpu(items, args, storage)
        if code:
            raise typer.Exit(code)
        if not quiet:
            _recommend(study, storage)
        return
    _join(campaign_file, study, storage, quiet)


def _recommend(study: str, storage: str) -> None:
    """What the campaign found, once every worker has stopped (the children ran quietly, side by side)."""
    from rich.console import Console

    from autoinfer.campaign.spec import stored_campaign
    from autoinfer.store.trials import load_study
    from autoinfer.sweep.report import print_recommendation

    loaded = load_study(study, storage)
    print_recommendation(Console(), loaded, stored_campaign(loaded))


def _join(campaign_file: Path | None, study: str, storage: str, quiet: bool) -> None:
    from rich.console import Console

    from autoinfer.campaign.spec import load_campaign, stored_campaign
    from autoinfer.store.trials import load_study
    from autoinfer.sweep.report import print_recommendation
    from autoinfer.sweep.runner import sweep

    if campaign_file is not None:
        campaign = load_campaign(campaign_file)
    else:
        campaign = stored_campaign(load_study(study, storage))
        if campaign is None:
            raise UserError(f"study {study!r} in {redact_url(storage)} has no campaign stored; pass the campaign file once")
    result = sweep(campaign, study_name=study, storage=storage, progress=not quiet)
    typer.echo(f"worker done: {result.ran} trial(s) measured here")
    if not quiet:
        print_recommendation(Console(), result.study, result.campaign)
