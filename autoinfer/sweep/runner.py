"""The campaign loop: ask Optuna → run the trial in an isolated child → tell Optuna; budgets; resume.

The loop knows nothing engine-specific. Failures are outcomes, never exceptions that end the sweep; a trial that
was running when a previous process died is failed and its configuration queued again.
"""

from __future__ import annotations

import random
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import optuna
from filelock import FileLock, Timeout
from optuna.trial import TrialState

from autoinfer.campaign.plan import plan
from autoinfer.campaign.space import to_config
from autoinfer.campaign.spec import Campaign, stored_campaign
from autoinfer.coordination import hardware, hostlock, worker
from autoinfer.engines import base
from autoinfer.engines.base import Engine, Measurement, Outcome
from autoinfer.errors import UserError
from autoinfer.measure.gpu import measured_gpus
from autoinfer.paths import default_storage, trial_dir
from autoinfer.search import pareto, select
from autoinfer.search.context import SearchContext
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.pruning import first_repetition_rule
from autoinfer.search.realize import realize_trial
from autoinfer.store import trials as store
from autoinfer.store.records import waiting_remeasurements
from autoinfer.store.redact import redact_url
from autoinfer.store.trials import Store, flagged_trials, record_of, write_trial
from autoinfer.sweep import quality_gate, repeats
from autoinfer.sweep.guard import TrialGuard, run_engine
from autoinfer.sweep.progress import SweepProgress
from autoinfer.sweep.recommend import as_best, recommend

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Keys whose change makes a stored study a different campaign (budgets may change between runs).
_IDENTITY_KEYS = ("engine", "model", "space", "objective", "measure", "serve", "constraints")


@dataclass(frozen=True)
class SweepResult:
    study: optuna.Study
    campaign: Campaign
    best: store.Best | None
    ran: int  # trials run by this process


def _max_skips(trial_budget: int) -> int:
    """Consecutive trials not run (memory, quality, refusal, predicted slower) after which the sweep stops: the space
    barely fits."""
    return max(50, 10 * trial_budget)


def make_sampler(campaign: Campaign) -> optuna.samplers.BaseSampler:
    seed = campaign.sampler.seed
    if campaign.sampler.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    startup = max(3, min(10, campaign.budget.trials // 3))
    with warnings.catch_warnings():  # multivariate/group are stable in practice; the warning only adds noise
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, group=True)


@contextmanager
def sqlite_single_worker(url: str, study_name: str) -> Iterator[None]:
    """SQLite supports one writer per study: a lock file beside the database makes a second worker fail clearly."""
    if not url.startswith("sqlite:///"):
        yield
        return
    lock_path = Path(url[len("sqlite:///"):]).with_suffix(f".{study_name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise UserError(
            f"another autoinfer process is running study {study_name!r} on {redact_url(url)}; SQLite allows one worker "
            "per study — wait for it, or use a PostgreSQL storage for several workers (README: workers)"
        ) from None
    try:
        yield
    finally:
        lock.release()


def open_study(campaign: Campaign, name: str, url: str) -> optuna.Study:
    """Create the study, or resume it if it exists and was made by the same campaign."""
    storage = worker.campaign_storage(url, campaign.workers)
    study = optuna.create_study(
        study_name=name, storage=storage, directions=pareto.directions(campaign), sampler=make_sampler(campaign),
        load_if_exists=True
    )
    previous = stored_campaign(study)
    if previous is not None:
        for key in _IDENTITY_KEYS:
            if getattr(previous, key) != getattr(campaign, key):
                raise UserError(
                    f"study {name!r} in {redact_url(url)} was made by a different campaign ({key!r} differs); "
                    "use --study NEW_NAME or the original campaign file"
                )
    Store(study).write_study(campaign=campaign.to_json())
    return study


def record(study: optuna.Study, trial: optuna.Trial, campaign: Campaign, m: Measurement) -> None:
    """Store a measurement and tell Optuna; memory outcomes and configurations the engine refuses become constraint
    violations, not scores (so the sampler steers away from them instead of proposing them again)."""
    write_trial(trial, **store.measurement_fields(m))
    store.write_run_files(trial_dir(study.study_name, trial.number), m)
    weights = campaign.objective_weights()
    limits = {"device": ("vram_mib", campaign.constraints.vram_mib, m.vram_peak_mib),
              "host": ("ram_mib", campaign.constraints.ram_mib, m.rss_peak_mib)}
    growth = record_of(trial).context_mib  # the serving context's, on the budget's side
    if m.outcome.is_memory or m.outcome is Outcome.REJECTED:
        if not any(v > 0 for v in trial.constraints.values()):  # a gate that found the cause (kld) already said so
            trial.set_constraint("memory" if m.outcome.is_memory else "rejected", 1.0)
        _tell(study, trial, state=TrialState.PRUNED)
        return
    if m.outcome in (Outcome.PRUNED, Outcome.PREDICTED_SLOWER):
        _tell(study, trial, state=TrialState.PRUNED)
        return
    value = store.score({"tg": list(m.tg_samples), "pp": list(m.pp_samples),
                         "kld": record_of(trial).kld_samples}, weights) if m.ok else None
    if value is None:
        if m.ok:
            write_trial(trial, outcome=Outcome.BAD_OUTPUT.value, reason=f"no samples for the objective {sorted(weights)}")
        _tell(study, trial, state=TrialState.FAIL)
        return
    for side, (key, limit, used) in limits.items():
        if limit is None:
            continue
        peak = f"peak {key[:-4]} {used or 0.0:.0f} MiB"
        if side == campaign.constraints.side and growth and used is not None:
            used += growth
            peak += (f" + {growth:.0f} MiB for the {campaign.serve.context}-token serving context (the KV cache "
                     f"llama-bench did not create) = {used:.0f} MiB")
        trial.set_constraint(key, (used or 0.0) - limit)
        if used is not None and used > limit:
            write_trial(trial, outcome=Outcome.INFEASIBLE.value, reason=f"{peak} is over the budget of {limit:.0f} MiB")
    _tell(study, trial, pareto.values(m) if pareto.enabled(campaign) else value)


def _tell(study: optuna.Study, trial: optuna.Trial, *args: Any, **kwargs: Any) -> None:
    """study.tell, raising UpdateFinishedTrialError like every other write when another worker has failed the trial
    (Optuna's own check says ValueError)."""
    try:
        study.tell(trial, *args, **kwargs)
    except ValueError:
        if Store(study).stored(trial).state.is_finished():
            raise optuna.exceptions.UpdateFinishedTrialError(f"trial {trial.number} was finished elsewhere") from None
        raise


def engine_refuses(engine: Engine, config: base.TrialConfig) -> Measurement | None:
    """A REJECTED record for a combination the engine is known to refuse, so no process is started for it."""
    reason = engine.refusal(config)
    return Measurement(Outcome.REJECTED, reason=f"not run: {reason}") if reason else None


def run_trial(engine: Engine, config: base.TrialConfig, campaign: Campaign, study_name: str,
              number: int, on_first_sample: Any = None) -> Measurement:
    """The measurement of trial `number`, on the GPU this worker sees."""
    return run_engine(engine, config, campaign, trial_dir(study_name, number), gpus=measured_gpus(),
                      on_first_sample=on_first_sample)


@contextmanager
def _refusal_fails_the_trial(study: optuna.Study) -> Iterator[list[optuna.Trial]]:
    """A refusal (UserError: bad input found while a trial was being set up or run) ends the sweep with one line.
    The trial it interrupted is failed with that reason, not left RUNNING for a resume to re-queue: its configuration
    would be refused again."""
    current: list[optuna.Trial] = []
    try:
        yield current
    except UserError as exc:
        for trial in current:
            if study.trials[trial.number].state == TrialState.RUNNING:
                write_trial(trial, outcome=Outcome.REJECTED.value, reason=f"refused: {exc}")
                _tell(study, trial, state=TrialState.FAIL)
        raise


def sweep(campaign: Campaign, *, study_name: str | None = None, storage: str | None = None,
          trials: int | None = None, wall_s: float | None = None, progress: bool = True,
          confirm: bool = False) -> SweepResult:
    """Run (or resume) a campaign until its trial or wall-time budget is spent, then confirm the top
    configurations (campaign key confirm; `confirm=True` re-confirms even when no trial ran since the last time)."""
    ready = plan(campaign, trials=trials, wall_s=wall_s)
    campaign, engine, dists, models = ready.campaign, ready.engine, ready.distributions, ready.models
    budget, decisions = campaign.budget, ready.decisions
    name = study_name or campaign.name
    url = storage or default_storage()
    qualities = quality_gate.prepare(campaign, models)

    with sqlite_single_worker(url, name):
        with worker.serialized(url, name):  # alone among the study's workers: create, bind, reclaim
            study = open_study(campaign, name, url)
            study_store = Store(study)
            machine = hardware.bind(study)
            requeued = worker.reclaim_stale(study, study_store.stale_running())
            if decisions:
                study_store.write_study(imposed_settings=decisions)
        ctx = SearchContext.create(campaign, engine, models)
        if ready.notes:
            ctx.notes.extend(ready.notes)
            study_store.write_study(search_notes=tuple(ctx.notes))
        strategy = select.create(ctx, MemoryScreen.create(ctx), dists)
        with worker.serialized(study):  # two workers must not both queue a proposal for the last budgeted trial
            strategy.start(study)
        skips = repeated = 0
        nudge = random.Random(campaign.sampler.seed)
        done = [t for t in study_store.records() if t.is_finished and not t.is_remeasurement]
        session_start = datetime.now()
        ran = charged = 0
        with SweepProgress(campaign, name, enabled=progress, done=len(done), requeued=requeued) as view, \
                TrialGuard(study, campaign, engine, view.note) as guard, \
                worker.SharedBudget(study, budget.trials, machine, view.note) as gate, \
                _refusal_fails_the_trial(study) as current:
            host = hostlock.for_campaign(campaign.engine, campaign.workers.allow_concurrent_on_host, view.note)

            def stop(reason: str) -> None:  # said and kept on the study: `status` tells why the sweep ended
                view.note(f"stopped: {reason}")
                study_store.write_study(stopped=reason)

            study_store.write_study(stopped=None)  # an earlier run's reason no longer holds
            while True:
                if (len(done) + charged >= budget.trials
                        and not waiting_remeasurements(study_store.records(states=(TrialState.WAITING,)))):
                    with host:  # the end anchor; what it queues again is measured now, before the confirmation
                        if not guard.end_anchor():
                            stop(f"trial budget of {budget.trials} reached")
                            break
                if budget.wall_s is not None and store.elapsed_s(study, session_start) >= budget.wall_s:
                    stop(f"wall-time budget of {budget.wall_s:.0f} s reached")
                    break
                trial = gate.ask(dists)
                if trial is None:
                    stop(f"trial budget of {budget.trials} reached (trials finished or running on any worker)")
                    break
                current[:] = [trial]
                params: dict[str, Any] = dict(trial.params)  # study.ask(dists) suggested every one
                config = engine.as_run(to_config(campaign, params, models))
                config = base.impose(realize_trial(ctx, config, record_of(trial)), decisions)
                write_trial(trial, config=config.to_params())
                if (growth := ctx.context_growth(config)) is not None:
                    write_trial(trial, context_mib=growth)
                if decisions:
                    write_trial(trial, imposed_settings={d.knob: d.value for d in decisions})
                asked = record_of(trial)
                source = repeats.earlier(study_store.records(), asked.config, flagged_trials(study), trial.number,
                                         ctx.command) if repeats.checked(asked) else None
                if source is not None:  # answered from the earlier measurement: nothing runs, no budget spent
                    repeats.answer(study, trial, source)
                    view.note(f"trial {trial.number}: configuration of trial {source.number} suggested again; "
                              "answered with its measurement, not run")
                    repeated += 1
                    with worker.serialized(study):
                        strategy.observe(study)
                    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                        continue  # a queued trial (the search's proposal, a retry) is what the next ask runs
                    if repeated >= repeats.NUDGE_AFTER or source.state == TrialState.RUNNING:
                        fresh = repeats.unmeasured(dists, study_store.records(), nudge)
                        if fresh is None:
                            stop(f"{repeated} suggestion(s) in a row were configurations already measured, and "
                                 f"{repeats.EXHAUSTED}")
                            break
                        if repeated > repeats.MAX_IN_A_ROW:
                            stop(f"{repeated} suggestions in a row were configurations already measured, also after "
                                 "configurations no trial had measured were queued")
                            break
                        with worker.serialized(study):  # other workers may fill the budget meanwhile
                            queued = gate.room()
                            if queued:
                                study_store.enqueue(fresh, explore_after_repeats=repeated)
                        if queued:
                            view.note(f"{repeated} repeat(s) in a row: a configuration no trial has measured or left "
                                      f"out, drawn at random, is queued ({' '.join(f'{k}={v}' for k, v in fresh.items())})")
                    continue
                repeated = 0
                view.start(trial.number, asked.shown_params)
                skipped = (engine_refuses(engine, config) or quality_gate.annotate(trial, config, qualities, campaign)
                           or strategy.screen(trial, config))
                if skipped is not None:  # recorded, costs no measurement, not counted against the budget
                    write_trial(trial, unmeasured=True)
                    record(study, trial, campaign, skipped)
                    view.finish(study_store.record(trial.number), recommend(study), counted=False)
                    skips += 1
                    with worker.serialized(study):
                        strategy.observe(study)
                    if skips > _max_skips(budget.trials):
                        stop(f"{skips} configurations in a row were not run (memory, quality, a combination the "
                             "engine refuses, or whole layers in RAM predicted to lose)")
                        break
                    if repeats.exhausted(dists, study_store.records()):
                        stop(repeats.EXHAUSTED)
                        break
                    continue
                skips = 0
                try:
                    with host:
                        m = guard.measure(trial, config, partial(run_trial, engine, config, campaign, name,
                                                                 trial.number, first_repetition_rule(campaign, study, config)))
                    write_trial(trial, host_lock_wait_s=round(host.waited_s, 3))
                    record(study, trial, campaign, m)
                except optuna.exceptions.UpdateFinishedTrialError:
                    if not study_store.stored(trial).stale:
                        raise  # finished by this process itself: a bug to show, not a stall to forgive
                    view.note(f"trial {trial.number} was failed by another worker while it ran here (no heartbeat "
                              "within the grace period) and re-queued: this measurement is dropped")
                    continue
                with worker.serialized(study):
                    strategy.observe(study)
                ran += 1
                charged += not asked.is_remeasurement
                view.finish(study_store.record(trial.number), recommend(study), counted=not asked.is_remeasurement)
                with host:  # the drift anchor measures too
                    guard.after_trial(trial.number)
            with host, worker.serialized(study):
                if worker.last_to_finish(study, view.note):  # confirm once, on the complete ranking
                    guard.finish(force_confirm=confirm)
            view.settle(recommend(study))
    return SweepResult(study, campaign, as_best(study, recommend(study)), ran)
