"""Measurement hygiene around every trial: idle check before, environment record around, noisy-trial re-run,
drift anchor and planted load between trials, confirmation at the end.

The loop in runner.py opens a TrialGuard (a context manager that always stops a planted load) and calls
measure, after_trial and finish; everything that decides whether
a number can be trusted lives here and in the modules it drives (measure.idle, measure.environment,
campaign.drift, campaign.confirm).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import optuna

from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Engine, Measurement, Outcome, RunContext, TrialConfig
from autoinfer.errors import UserError
from autoinfer.measure import environment, idle
from autoinfer.measure.gpu import measured_gpus
from autoinfer.measure.stats import summarize
from autoinfer.paths import trial_dir
from autoinfer.store.records import Noise, waiting_remeasurements
from autoinfer.store.trials import Store, write_run_files, write_trial
from autoinfer.sweep.confirm import confirm
from autoinfer.sweep.drift import DriftAnchor, LoadInjector


def sample_stats(m: Measurement) -> dict[str, Any]:
    """Median, 95% bootstrap interval and coefficient of variation of each kind of sample a trial has."""
    return {kind: summarize(samples).to_dict()
            for kind, samples in (("tg", m.tg_samples), ("pp", m.pp_samples)) if samples}


def noisiest(m: Measurement, weights: dict[str, float]) -> float | None:
    """The largest coefficient of variation among the objective's samples (None with fewer than 2 samples)."""
    cvs = [s["cv"] for kind, s in sample_stats(m).items() if kind in weights and s["cv"] is not None]
    return max(cvs) if cvs else None


def run_engine(engine: Engine, config: TrialConfig, campaign: Campaign, artifacts: Path, *,
               gpus: tuple[int, ...], on_first_sample: Callable[[float], bool] | None = None) -> Measurement:
    """One isolated measurement; an engine bug becomes a CRASH outcome instead of ending the campaign."""
    artifacts.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ctx = RunContext(timeout_s=campaign.measure.timeout_s, artifacts=artifacts, gpus=gpus,
                     on_first_sample=on_first_sample)
    try:
        return engine.run(config, ctx)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 — recorded with its reason, the campaign goes on
        return Measurement(Outcome.CRASH, reason=f"engine error: {type(exc).__name__}: {exc}",
                           wall_s=time.monotonic() - started)


def pooled(first: Measurement, second: Measurement) -> Measurement:
    """Both runs of a re-measured trial as one: samples concatenated, times summed, memory peaks maxed."""
    def peak(a: float | None, b: float | None) -> float | None:
        return max(v for v in (a, b) if v is not None) if a is not None or b is not None else None

    return replace(
        second,
        tg_samples=first.tg_samples + second.tg_samples,
        pp_samples=first.pp_samples + second.pp_samples,
        wall_s=first.wall_s + second.wall_s,
        engine_s=(first.engine_s or 0.0) + (second.engine_s or 0.0) if first.engine_s or second.engine_s else None,
        vram_peak_mib=peak(first.vram_peak_mib, second.vram_peak_mib),
        rss_peak_mib=peak(first.rss_peak_mib, second.rss_peak_mib),
        vram_per_gpu_mib=tuple(max(a, b) for a, b in zip(first.vram_per_gpu_mib, second.vram_per_gpu_mib)),
    )


class TrialGuard:
    """Owns the per-campaign measurement hygiene of one sweep process."""

    def __init__(self, study: optuna.Study, campaign: Campaign, engine: Engine,
                 note: Callable[[str], None]) -> None:
        self.study = study
        self.campaign = campaign
        self.engine = engine
        self.note = note
        self.gpus = measured_gpus()
        self.weights = campaign.objective_weights()
        self.load = LoadInjector(campaign.inject_load, note)
        self.anchor = DriftAnchor(study, campaign, self.extra_run, note)

    def extra_run(self, config: TrialConfig, folder: Path) -> Measurement:
        """A run outside the trial sequence, with the same idle check and environment record as a trial."""
        seen = self.idle_check()
        start = environment.begin(self.gpus)
        m = run_engine(self.engine, config, self.campaign, folder, gpus=self.gpus)
        write_run_files(folder, m)
        return replace(m, env={**m.env, **self.environment(start, config, m), "idle": seen})

    def idle_check(self) -> dict[str, Any]:
        seen = idle.guard(self.campaign.idle.policy, cpu_busy=self.campaign.idle.cpu_busy_percent,
                          wait_s=self.campaign.idle.wait_s, exclude=self.load.pids())
        if seen.get("busy"):
            self.note(f"machine busy before the run: {'; '.join(seen['busy_reasons'])}")
        return seen

    def environment(self, start: environment.EnvironmentStart, config: TrialConfig,
                    m: Measurement) -> dict[str, Any]:
        tokens = len(m.pp_samples) * config.n_prompt + len(m.tg_samples) * config.n_gen
        return environment.finish(start, gpus=self.gpus, model=config.model,
                                  tools=self.engine.tools, tokens=tokens or None)

    def measure(self, trial: optuna.Trial, config: TrialConfig, run: Callable[[], Measurement]) -> Measurement:
        """Idle check, the trial's run(s) with their environment, and its statistics as trial user attributes.

        A successful trial whose objective samples spread more than measure.max_cv is run once more and both
        runs' samples count; the first run's files stay in the trial folder under first_run/.
        """
        self.load.before_trial(trial.number)
        write_trial(trial, idle=self.idle_check())
        start = environment.begin(self.gpus)
        m = run()
        m = replace(m, env={**m.env, **self.environment(start, config, m)})
        spread = noisiest(m, self.weights) if m.ok else None
        limit = self.campaign.measure.max_cv
        if spread is not None and limit is not None and spread > limit and self.campaign.measure.rerun_noisy:
            self.note(f"trial {trial.number}: spread {spread:.1%} over max_cv {limit:.0%}; measuring it again")
            write_run_files(trial_dir(self.study.study_name, trial.number) / "first_run", m)
            start = environment.begin(self.gpus)
            second = run()
            second = replace(second, env={**second.env, **self.environment(start, config, second)})
            write_trial(trial, noise=Noise(spread, limit, True, m.tg_samples, m.pp_samples, second.outcome.value))
            m = pooled(m, second) if second.ok else second
        write_trial(trial, stats=sample_stats(m))
        return m

    def after_trial(self, number: int) -> None:
        """Between trials: the drift anchor when it is due, then the planted load's schedule."""
        self.anchor.after_trial(number)
        self.load.after_trial(number)

    def end_anchor(self) -> bool:
        """The end anchor once the trial budget is spent; True when it queued trials again, which the loop then
        measures before the confirmation."""
        self.load.stop()
        return bool(self.anchor.finish())

    def finish(self, *, force_confirm: bool) -> None:
        """End of this sweep process: stop any planted load, measure the anchor a last time, then confirm.

        The confirmation runs when `force_confirm` is set, or when the campaign's confirm.enabled is and trials were
        measured since the stored confirmation (or there is none).
        """
        self.load.stop()
        self.anchor.finish()
        study_store = Store(self.study)
        trials = study_store.records()
        if waiting := waiting_remeasurements(trials):
            self.note(f"drift: {len(waiting)} re-measurement(s) still queued (the wall-time budget ended the sweep); "
                      "`autoinfer sweep` again measures them")
        finished = sum(1 for t in trials if t.is_finished)
        previous = study_store.study_record().confirmed
        if force_confirm or (self.campaign.confirm.enabled
                             and (previous.after_trials if previous is not None else None) != finished):
            confirm(self.study, self.campaign, self.extra_run, self.note)

    def __enter__(self) -> TrialGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.load.stop()  # a planted load never outlives the sweep, whatever ended it
