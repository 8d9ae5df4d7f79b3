"""`autoinfer sweep`, `status` and `export`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from autoinfer.errors import UserError

DEFAULT_CAMPAIGN = Path(__file__).resolve().parents[1] / "experiments" / "cpu-smoke.yaml"
ANNOUNCE_CHECK = "\ndeployment check: running the printed command once and asking it for text …"

StudyOpt = typer.Option(None, "--study", help="Study name (default: the campaign's name, or the latest study).")
StorageOpt = typer.Option(None, "--storage", help="Optuna storage URL (default: sqlite:///results/autoinfer.db).")


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command()(status)
    app.command()(export)


def sweep(
    campaign_file: Optional[Path] = typer.Argument(None, help="Campaign or contest YAML (default: the CPU smoke "
                                                 "campaign)."),
    study: Optional[str] = StudyOpt,
    storage: Optional[str] = StorageOpt,
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Trial budget (counts trials already done)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1, help="Wall-time budget in seconds."),
    quiet: bool = typer.Option(False, "--quiet", help="No live display."),
    confirm: bool = typer.Option(False, "--confirm", help="Re-measure the top configurations interleaved now, "
                                 "even if the campaign already confirmed them."),
) -> None:
    """Run or resume a campaign, confirm its top configurations, print the winner and the command to use it, and
    start that command once (deployment check). A contest file (`contenders:` a list of campaign files) runs every
    contender, then an interleaved final between their best configurations.

    Exits with status 3 and a diagnosis (the most common failure and its fix) when every trial failed, and with
    status 1 when the deployment check fails."""
    from autoinfer.campaign.contest import is_contest
    from autoinfer.campaign.spec import load_campaign
    from autoinfer.campaign.yaml_loader import load_yaml
    from autoinfer.sweep.deploy import check_recommendation
    from autoinfer.sweep.diagnosis import SWEEP_FAILED, diagnose
    from autoinfer.sweep.recommend import as_best, recommend
    from autoinfer.sweep.report import print_deployment_check, print_recommendation
    from autoinfer.sweep.runner import sweep as run_sweep

    path = campaign_file or DEFAULT_CAMPAIGN
    data = load_yaml(path) if path.is_file() else None
    if is_contest(data):
        if study is not None:
            raise UserError("--study names one study; a contest's studies are named by the `name:` of its contest "
                            "and campaign files")
        sweep_contest(path, data, storage=storage, trials=trials, timeout=timeout, quiet=quiet, confirm=confirm)
        return
    campaign = load_campaign(path, data)
    result = run_sweep(campaign, study_name=study, storage=storage, trials=trials, wall_s=timeout,
                       progress=not quiet, confirm=confirm)
    failed = diagnose(result.study)
    if failed is not None:
        Console(stderr=True).print(f"[red]no recommendation[/red]: {failed.line()}", soft_wrap=True, highlight=False)
        raise SystemExit(SWEEP_FAILED)  # not typer.Exit: main() runs click outside standalone mode
    console = Console()
    print_recommendation(console, result.study, result.campaign)
    best = as_best(result.study, recommend(result.study))
    check = check_recommendation(result.study, result.campaign, best, announce=lambda: console.print(ANNOUNCE_CHECK))
    print_deployment_check(console, check)
    if check.status == "failed":  # the printed command does not work: the sweep's answer is not usable as is
        raise SystemExit(1)


def status(study: Optional[str] = StudyOpt, storage: Optional[str] = StorageOpt) -> None:
    """Trials done/failed/infeasible/remaining, the best so far with its spread, elapsed and estimated time left."""
    from autoinfer.store.trials import load_study
    from autoinfer.sweep.contest import contest_of
    from autoinfer.sweep.report import print_contest, print_status

    loaded = load_study(study, storage)
    if (record := contest_of(loaded)) is not None:
        print_contest(Console(), loaded.study_name, record)
    else:
        print_status(Console(), loaded)


def export(
    study: Optional[str] = StudyOpt,
    storage: Optional[str] = StorageOpt,
    format: str = typer.Option("server", "--format", help="server | bench | python | generate | json | yaml"),
    out: Optional[Path] = typer.Option(None, "--out", help="Write to this file instead of standard output."),
    vram_budget: Optional[float] = typer.Option(None, "--vram-budget", min=1,
                                                help="Pick from the Pareto front: the best within this many MiB."),
    objective: Optional[str] = typer.Option(None, "--objective", help="With the front: tg | pp | balanced."),
    force: bool = typer.Option(False, "--force", help="Replace the --out file if it exists."),
) -> None:
    """The best feasible configuration as a llama-server or llama-bench command line (the reference engine's: its
    worker's, or generate's), or a JSON/YAML file."""
    from autoinfer.export.formats import FORMATS, render
    from autoinfer.store.trials import load_study

    if format not in FORMATS:
        raise UserError(f"unknown --format {format!r}; use one of {', '.join(FORMATS)}")
    loaded, campaign, best = exported(load_study(study, storage), storage, vram_budget, objective)
    text = render(format, best, loaded.study_name, campaign.engine if campaign else "llama-bench")
    if out:
        write_export(out, text, force)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=not text.endswith("\n"))


def exported(loaded, storage: Optional[str], vram_budget: Optional[float], objective: Optional[str]):
    """The study, campaign and configuration `export` renders: a contest's winner from its contender's study, the
    best within a budget from the front, or the study's recommendation."""
    from autoinfer.campaign.spec import stored_campaign
    from autoinfer.sweep.contest import contest_of, winner
    from autoinfer.sweep.diagnosis import diagnose
    from autoinfer.sweep.recommend import as_best, recommend

    if (record := contest_of(loaded)) is not None:
        if vram_budget is not None or objective is not None:
            raise UserError(f"study {loaded.study_name!r} is a contest; --vram-budget and --objective pick from one "
                            "campaign's front: give --study CONTENDER")
        found = winner(loaded, record, storage)
        if found is None:
            raise UserError(f"contest {loaded.study_name!r} has no winner; `autoinfer status --study "
                            f"{loaded.study_name}` shows its final")
        return found
    if vram_budget is not None or objective is not None:
        from autoinfer.search.pareto import pick

        best = pick(loaded, vram_budget, objective or "balanced")
    else:
        best = as_best(loaded, recommend(loaded))
    if best is None:
        failed = diagnose(loaded)
        if failed is not None:
            raise UserError(f"study {loaded.study_name!r} has nothing to export: {failed.line()}")
        raise UserError(f"study {loaded.study_name!r} has no feasible successful trial yet; run `autoinfer sweep`")
    return loaded, stored_campaign(loaded), best


def sweep_contest(path: Path, data: dict, *, storage: Optional[str], trials: Optional[int], timeout: Optional[float],
                  quiet: bool, confirm: bool) -> None:
    """`autoinfer sweep CONTEST.yaml`: every contender's campaign, the interleaved final, the winner's command and
    its deployment check (exit statuses as for a campaign)."""
    from autoinfer.campaign.contest import load_contest
    from autoinfer.sweep import deploy
    from autoinfer.sweep.contest import run_contest, winner
    from autoinfer.sweep.diagnosis import SWEEP_FAILED
    from autoinfer.sweep.report import print_contest, print_contest_command, print_deployment_check

    contest, campaigns = load_contest(path, data)
    console = Console()
    result = run_contest(contest, campaigns, storage=storage, trials=trials, wall_s=timeout, progress=not quiet,
                         confirm=confirm, note=lambda line: console.print(line, markup=False, highlight=False))
    print_contest(console, contest.name, result.record)
    found = winner(result.study, result.record, storage)
    if found is None:
        Console(stderr=True).print(f"[red]no recommendation[/red]: contest {contest.name!r} has no finalist that ran "
                                   f"successfully; `autoinfer status --study <contender>` shows why", highlight=False)
        raise SystemExit(SWEEP_FAILED)
    member, campaign, best = found
    print_contest_command(console, best, member, campaign.engine)
    check = deploy.check_recommendation(member, campaign, best, announce=lambda: console.print(ANNOUNCE_CHECK))
    deploy.record(result.study, check)
    print_deployment_check(console, check)
    if check.status == "failed":
        raise SystemExit(1)


def write_export(out: Path, text: str, force: bool) -> None:
    """Write an export whole (a kill leaves the old file or the new one), never over a file unless asked."""
    from autoinfer import atomic

    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name, e.g. --out {out / 'best.sh'}")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist; create it or choose another path")
    if out.exists() and not force:
        raise UserError(f"--out {out} exists; add --force to replace it")
    try:
        atomic.write_text(out, text)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror}); choose a writable path") from None
