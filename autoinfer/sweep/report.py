"""What `sweep` prints at the end and what `status` prints: read back from the store, never from memory."""

from __future__ import annotations

import statistics
from collections import Counter

import optuna
from rich.console import Console
from rich.table import Table

from autoinfer.campaign.spec import stored_campaign
from autoinfer.engines.base import capabilities
from autoinfer.export.formats import render
from autoinfer.search.pareto import prompt_alternative
from autoinfer.search.status import status_rows
from autoinfer.store.records import FIT_ANSWER, Confirmation, ContestRecord, DeploymentCheck, TrialRecord
from autoinfer.store.trials import Store
from autoinfer.sweep import deploy
from autoinfer.sweep.confirm import finalists, stored_summary, summary
from autoinfer.sweep.diagnosis import diagnose
from autoinfer.sweep.drift import status_line
from autoinfer.sweep.progress import describe
from autoinfer.sweep.recommend import Recommendation, as_best, recommend


def spread(samples: list[float]) -> str:
    if not samples:
        return "—"
    med = statistics.median(samples)
    if len(samples) == 1:
        return f"{med:.2f} (1 sample)"
    return f"{med:.2f} (min {min(samples):.2f}, max {max(samples):.2f}, n={len(samples)})"


def measured(t: TrialRecord, confirmation: Confirmation | None, kind: str) -> str:
    """The confirmation's runs first when it measured this trial (one median per fresh process, the number to
    expect), then the search's own run: a single process can land in a fast or slow mode of the machine."""
    search = spread(t.samples(kind))
    runs = confirmation.run_medians({t.number}, kind) if confirmation else []
    if not runs:
        return search
    return (f"{statistics.median(runs):.2f} over {len(runs)} confirmation runs (min {min(runs):.2f}, "
            f"max {max(runs):.2f}); search run {search}")


def print_status(console: Console, study: optuna.Study) -> None:
    campaign = stored_campaign(study)
    study_store = Store(study)
    trials = study_store.records()
    kept = study_store.study_record()
    finished = [t for t in trials if t.is_finished and not t.is_remeasurement]  # as the budget counts them
    again = sum(t.is_finished and t.is_remeasurement for t in trials)
    outcomes = Counter(t.status for t in trials)
    budget = campaign.budget.trials if campaign else len(finished)
    table = Table(title=f"study {study.study_name}", show_header=False)
    table.add_row("campaign", f"{campaign.name} (engine {campaign.engine})" if campaign else "imported")
    if campaign and campaign.serve.context:
        counted = [t.context_mib for t in trials if t.context_mib]
        table.add_row("serving context", f"{campaign.serve.context} tokens, the printed server's -c" + (
            f"; {min(counted):.0f}-{max(counted):.0f} MiB of KV cache and attention mask beyond the measurement's "
            "context counted on each peak against the budget" if counted else ""))
    table.add_row("trials", f"{len(finished)} done of {budget}, {max(budget - len(finished), 0)} remaining"
                  + (f"; {again} drift re-measurement(s) beside them, outside the budget" if again else ""))
    table.add_row("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    infeasible = sum(v for k, v in outcomes.items() if k in ("oom", "infeasible", "predicted_infeasible"))
    table.add_row("infeasible", str(infeasible))
    for key, value in status_rows(study):
        table.add_row(key, value)
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    if starts and ends:
        elapsed = (max(ends) - min(starts)).total_seconds()
        table.add_row("elapsed", f"{elapsed:.0f} s")
        walls = [float(t.wall_s) for t in finished if t.wall_s]
        if walls and budget > len(finished):
            table.add_row("estimated left", f"{statistics.mean(walls) * (budget - len(finished)):.0f} s")
    rec = recommend(study)
    confirmed = kept.confirmed
    table.add_row("confirmed", f"{stored_summary(study, confirmed)} (measured after {confirmed.after_trials} trials)"
                  if confirmed else _unconfirmed(study, campaign, len(finished) >= budget))
    if (drift := status_line(study)) is not None:
        table.add_row("drift anchor", drift)
    if rec is not None and rec.busy:
        table.add_row("[bold red]busy machine[/bold red]", rec.busy)
    table.add_row("deployment check", deployment_line(deploy.stored(study), rec))
    for imposed in kept.imposed_settings:
        table.add_row("imposed on every trial", f"{imposed.knob}={imposed.value}: {imposed.reason}")
    if rec is None:
        failed = diagnose(study)
        table.add_row("recommended", f"none: {failed.line()}" if failed else "no feasible successful trial yet")
    else:
        t = study_store.record(rec.trial)
        table.add_row("recommended", f"trial {t.number}: {describe(t.shown_params)}")
        table.add_row("  why", rec.why)
        table.add_row("  objective", _speed(rec))
        table.add_row("  tg tok/s", measured(t, confirmed if rec.confirmed else None, "tg"))
        table.add_row("  pp tok/s", measured(t, confirmed if rec.confirmed else None, "pp"))
        table.add_row("  peak memory", _memory(t))
        if rec.alternative is not None:
            table.add_row("  alternative", rec.alternative.line())
        if (prompt := prompt_alternative(study, rec.trial)) is not None:
            table.add_row("  alternative", prompt.line())
    console.print(table)


def _unconfirmed(study: optuna.Study, campaign, budget_spent: bool) -> str:
    """Why a study has no confirmation: what happened, not what would happen in a sweep that already ended."""
    if campaign is None:
        return "no (an imported study; `autoinfer sweep --confirm` needs a campaign)"
    if not campaign.confirm.enabled:
        return "off (confirm.enabled is false in the campaign); `autoinfer sweep --confirm` runs it on demand"
    n = len(finalists(study, campaign.objective_weights(), campaign.confirm.top_k))
    if n < 2:
        when = "skipped at the end of the sweep" if budget_spent else "not possible yet"
        return f"{when}: {n} successful configuration(s) without drift flags, at least 2 are needed"
    if not budget_spent:
        return "not yet (runs when the trial budget is spent)"
    return ("not run: the trial budget is spent but the sweep ended before confirming (interrupted?); "
            "`autoinfer sweep --confirm` runs it")


def _speed(rec: Recommendation) -> str:
    ci = f", 95% CI {rec.ci[0]:.2f}–{rec.ci[1]:.2f}" if rec.ci else ""
    return f"{rec.speed:.2f} (median of {rec.runs} run(s){ci})"


def _memory(t: TrialRecord) -> str:
    vram, rss = t.vram_peak_mib, t.rss_peak_mib
    parts = [f"{name} {value:.0f} MiB" for name, value in (("VRAM", vram), ("RSS", rss)) if value]
    if t.context_mib:  # counted on top of the peak on the budget's side
        parts.append(f"+ {t.context_mib:.0f} MiB for the serving context (-c {(t.config or {}).get('ctx_size')}, "
                     "counted from the model file against the budget)")
    if "huge_pages_mib" in t.metrics:  # it asked for them: say whether it got them
        huge = t.metrics["huge_pages_mib"]
        parts.append("huge pages not read" if huge is None else f"{huge:.0f} MiB of it on huge pages")
    return ", ".join(parts) or "not measured"


def deployment_line(check: DeploymentCheck | None, rec: Recommendation | None) -> str:
    """What status and the report say about the deployment check of the current recommendation."""
    if check is None:
        return "not run (it runs at the end of `autoinfer sweep`)"
    if rec is not None and check.trial is not None and check.trial != rec.trial:
        return f"not run for trial {rec.trial}; the last check ({check.line()}) was for another trial"
    return check.line()


def print_deployment_check(console: Console, check: DeploymentCheck) -> None:
    """The check's result; a failure loudly, with the command that failed, since the printed answer does not work."""
    if check.status == "failed":
        console.print("[bold red]DEPLOYMENT CHECK FAILED[/bold red]: do not use the recommended command as printed; "
                      "the reason is below.")
        if check.memory:
            console.print(f"  memory: {check.memory}", markup=False, highlight=False)
        console.print(f"  reason: {check.reason}", markup=False, highlight=False)
        console.print(f"  command: {check.command}", markup=False, highlight=False, soft_wrap=True)
    elif check.status == "passed":
        console.print(f"deployment check {check.line()}", style="yellow" if check.over_budget else "green",
                      markup=False, highlight=False)
        if check.over_budget:
            console.print("[bold yellow]WARNING[/bold yellow]: as printed, llama-server went over the RAM budget; "
                          "the sweep's peak is llama-bench's, whose process is smaller.")
    else:
        console.print(f"deployment check {check.line()}", markup=False, highlight=False)


def print_recommendation(console: Console, study: optuna.Study, campaign) -> None:
    rec = recommend(study)
    best = as_best(study, rec)
    if rec is None or best is None:
        console.print(f"[red]no feasible successful trial in study {study.study_name!r}[/red]; "
                      f"see `autoinfer status --study {study.study_name}`")
        return
    t = best.trial
    if rec.busy:
        console.print(f"\n[bold red]busy machine:[/bold red] {rec.busy}", highlight=False)
    console.print(f"\n[bold]recommended for study {study.study_name!r}[/bold]: trial {t.number}  {describe(t.shown_params)}")
    console.print(f"  {rec.why}", markup=False, highlight=False)
    if confirmed := Store(study).study_record().confirmed:
        console.print(f"  {stored_summary(study, confirmed)}", markup=False, highlight=False)
    console.print(f"  objective:        {_speed(rec)}")
    console.print(f"  generation tok/s: {measured(t, best.confirmation, 'tg')}")
    console.print(f"  prompt tok/s:     {measured(t, best.confirmation, 'pp')}")
    console.print(f"  peak memory:      {_memory(t)}")
    if rec.alternative is not None:
        console.print(f"  {rec.alternative.line()}", markup=False, highlight=False)
    if (prompt := prompt_alternative(study, rec.trial)) is not None:
        console.print(f"  {prompt.line()}", markup=False, highlight=False)
    if capabilities(campaign.engine).llama_settings:
        console.print("\nrun it with:")
        console.print(render("server", best, study.study_name), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"\nits {campaign.engine} engine settings:")
        console.print(render("yaml", best, study.study_name, campaign.engine), markup=False, highlight=False)
        print_generate(console, best, study.study_name, campaign.engine)


def print_generate(console: Console, best, study_name: str, engine: str) -> None:
    """The command that generates text with the configuration, for engines that have one."""
    if capabilities(engine).generates:
        console.print("\ngenerate text with it:")
        console.print(render("generate", best, study_name, engine), markup=False, highlight=False, soft_wrap=True)


def print_contest(console: Console, name: str, record: ContestRecord) -> None:
    """A contest's final: every finalist with its confirmed median and memory, the ratios as hyperfine says them, the
    verdict, and the contenders left out."""
    final = record.final
    title = f"contest {name}: " + (f"final over {final.rounds} interleaved rounds in fresh processes"
                                   if final else "no final (fewer than two finalists)")
    table = Table(title=title)
    for column in ("finalist", "engine", "median (95% CI)", "runs ok/failed", "peak memory", "host RSS"):
        table.add_column(column)
    for entry in record.entries:
        f = final.finalist(entry.key) if final else None
        median = "—" if f is None or f.median is None else f"{f.median:.2f}" + (
            f" ({f.ci[0]:.2f}–{f.ci[1]:.2f})" if f.ci else "")
        runs = f"{len(f.scores)}/{f.failed_runs}" if f else "—"
        memory = "—" if f is None or f.memory_mib is None else f"{f.memory_kind} {f.memory_mib:.0f} MiB" + (
            f" + {f.context_mib:.0f} at the serving context" if f.context_mib else "")
        # the host's side too: engines differ there (the reference engine pins its experts, llama.cpp maps the file)
        rss = [r.rss_peak_mib for r in final.runs if r.trial == entry.key and r.rss_peak_mib] if final else []
        table.add_row(f"{entry.study} trial {entry.trial}" + (f" ({FIT_ANSWER})" if entry.baseline else ""),
                      entry.engine, median, runs, memory, f"{statistics.median(rss):.0f} MiB" if rss else "—")
    console.print(table)
    if final is not None:
        console.print(summary(final, record.label), markup=False, highlight=False)
        if final.verdict.why:
            console.print(f"  {final.verdict.why}", markup=False, highlight=False)
        if final.verdict.alternative is not None:
            alt = final.verdict.alternative
            console.print(f"  lighter alternative: {record.label(alt.trial)}, {alt.slower:.0%} slower, "
                          f"{alt.saves_mib:.0f} MiB less", markup=False, highlight=False)
    for line in record.left_out:
        console.print(f"  left out: {line}", markup=False, highlight=False)
    winner = record.winner
    console.print(f"\n[bold]recommended by contest {name!r}[/bold]: "
                  + (winner.label() if winner else "none (no finalist ran successfully twice)"), highlight=False)


def print_contest_command(console: Console, best, study: optuna.Study, engine: str) -> None:
    """How to run the contest's winner: llama-server for llama.cpp settings, else the engine's own command."""
    if capabilities(engine).llama_settings:
        console.print("\nrun it with:")
        console.print(render("server", best, study.study_name), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"\nrun it with (the {engine} engine's own command, as measured):")
        console.print(render("bench", best, study.study_name, engine), markup=False, highlight=False,
                      soft_wrap=True)
        print_generate(console, best, study.study_name, engine)
