"""The drift anchor: one fixed configuration re-measured during a campaign, so a slow machine is noticed.

Thermal throttling or another program on the machine makes every trial measured meanwhile look worse than it
is, and a search then crowns whatever ran before. The anchor is the first successful trial's configuration
(with `drift.baseline` overriding parameters). Its reference is `drift.reference_runs` runs after that trial (the
trial's own run is the first of them when no baseline changes the configuration); then it runs every `drift.every`
trials and at the end. The reference runs span the machine's own run-to-run spread (a process that lands on a
slower core or clock can measure 40% off on a small VM); an anchor drifts when its score falls more than
`drift.threshold` outside that span, and a second run right after it does too (one run outside is one process's
outlier, which such a machine gives now and then). The trials since the last good anchor are then flagged (left
out of the best and the confirmation) and queued again, and the campaign backs off and re-measures the anchor
until it recovers or `drift.max_backoffs` is spent. Everything is kept on the study (StudyRecord.drift, a
DriftState); the flagged trial numbers in StudyRecord.drift_flagged.

`inject_load` plants that kind of slowdown on purpose (busy-loop processes for a few trials), so the guard can be
checked on one's own machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import optuna

from autoinfer.campaign.spec import Campaign, InjectLoad, stored_campaign
from autoinfer.engines.base import Measurement, Outcome, TrialConfig
from autoinfer.paths import results_dir
from autoinfer.store import trials as store
from autoinfer.store.records import AnchorRun, DriftEvent, DriftState, TrialRecord
from autoinfer.store.trials import Store, flagged_trials

# A busy loop that ends by itself when the process that started it is gone (even if it died by SIGKILL).
_BUSY_LOOP = (
    "import os, sys\n"
    "parent = int(sys.argv[1])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)


class LoadInjector:
    """Busy-loop processes from trial `after_trial` for `trials` trials (campaign key inject_load)."""

    def __init__(self, spec: InjectLoad | None, note: Callable[[str], None]) -> None:
        self.spec = spec
        self.note = note
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_at: int | None = None
        self.trials_under_load = 0

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def before_trial(self, number: int) -> None:
        if self.spec is None or self.procs or self.started_at is not None or number < self.spec.after_trial:
            return
        self.started_at = number
        # Each loop in its own session, as other people's programs are: where the kernel groups CPU time by session
        # (autogroup), loops sharing the sweep's session took one share beside the engine's, and a short measurement
        # often ran unslowed (a 2.7x slowdown against 20x with a session each, llama-bench on two cores).
        self.procs = [
            subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(os.getpid())], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(self.spec.processes)
        ]
        self.note(f"inject_load: {self.spec.processes} busy-loop process(es) started before trial {number}")

    def after_trial(self, number: int) -> None:
        if not self.procs or self.spec is None:
            return
        self.trials_under_load += 1
        if self.trials_under_load >= self.spec.trials:
            self.stop()
            self.note(f"inject_load: stopped after trial {number}")

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def _score(m: Measurement, weights: dict[str, float]) -> float | None:
    return store.score({"tg": list(m.tg_samples), "pp": list(m.pp_samples)}, weights) if m.ok else None


class DriftAnchor:
    """Schedules, measures and judges the anchor; state lives in the study so a resumed campaign continues it."""

    def __init__(self, study: optuna.Study, campaign: Campaign,
                 run: Callable[[TrialConfig, Any], Measurement], note: Callable[[str], None]) -> None:
        self.study = study
        self.study_store = Store(study)
        self.spec = campaign.drift
        self.weights = campaign.objective_weights()
        self.run = run
        self.note = note
        self.state: DriftState = self.study_store.study_record().drift or DriftState()

    @property
    def enabled(self) -> bool:
        return self.spec.every is not None

    def _save(self, state: DriftState) -> None:
        self.state = state
        self.study_store.write_study(drift=state)

    def _finished(self) -> list[TrialRecord]:
        return [t for t in self.study_store.records() if t.is_finished]

    def _reference(self) -> list[float]:
        """The scores of the successful start runs: the band a later anchor is judged against."""
        return [a.score for a in self.state.anchors
                if (a.label == "start" or a.rebased) and a.score is not None and not a.discarded]

    def _last_good(self) -> AnchorRun | None:
        good = [a for a in self.state.anchors if not a.drifted or a.rebased]
        return good[-1] if good else None

    def _config(self) -> TrialConfig | None:
        if self.state.config is None:
            first = next((t for t in self._finished() if t.is_feasible_ok), None)
            if first is None:
                return None
            self.state = replace(self.state, config={**first.config, **self.spec.baseline}, from_trial=first.number)
        return TrialConfig.from_params(dict(self.state.config))

    def measure(self, after_trial: int, label: str) -> AnchorRun:
        """One anchor run, judged against the reference runs and recorded."""
        config = self._config()
        assert config is not None  # callers measure only once a configuration is known
        m = self.run(config, results_dir() / self.study.study_name / "anchors" / str(len(self.state.anchors)))
        return self._record(after_trial, label, m)

    def _record(self, after_trial: int, label: str, m: Measurement, trial: int | None = None) -> AnchorRun:
        value = _score(m, self.weights)
        ref = self._reference() if label != "start" else []
        ratio = value / statistics.median(ref) if value is not None and ref else None
        t = self.spec.threshold
        drifted = value is None or bool(ref) and not min(ref) * (1 - t) <= value <= max(ref) * (1 + t)
        entry = AnchorRun(len(self.state.anchors), label, after_trial, value, ratio, drifted, time.time(),
                          m.outcome.value, m.reason[:500], m.tg_samples, m.pp_samples,
                          bool((m.env.get("idle") or {}).get("busy")), trial)
        self._save(replace(self.state, anchors=(*self.state.anchors, entry)))
        shown = f"{value:.2f}" if value is not None else m.outcome.value
        source = f"trial {trial}'s own run" if trial is not None else f"after trial {after_trial}"
        self.note(f"drift anchor ({label}, {source}): {shown}"
                  + (f", {ratio:.2f}× its reference" if ratio is not None else ""))
        return entry

    def _first_trial_run(self) -> Measurement | None:
        """The first successful trial's own measurement, when the anchor is exactly its configuration: one more
        process in the reference, so a machine whose processes land in a fast or a slow mode is less likely to have
        every reference run in one mode."""
        number = self.state.from_trial
        if number is None:
            return None
        trial = self.study_store.record(number)
        if trial.config != self.state.config:
            return None
        return Measurement(Outcome.OK, tg_samples=trial.tg_samples, pp_samples=trial.pp_samples, env=dict(trial.env))

    def measure_reference(self, after_trial: int) -> None:
        """The start runs; their spread is the machine's run-to-run noise, which no later anchor is blamed for. The
        first trial's own run counts as one of them when the anchor is that configuration."""
        first = self._first_trial_run()
        if first is not None:
            self._record(after_trial, "start", first, trial=self.state.from_trial)
        for _ in range(self.spec.reference_runs - (first is not None)):
            self.measure(after_trial, "start")
        ref = self._reference()
        if len(ref) > 1 and max(ref) / min(ref) - 1 > self.spec.threshold:
            self.note(f"drift anchor: its {len(ref)} reference runs spread {max(ref) / min(ref) - 1:.0%} on this "
                      f"machine; a single trial cannot tell configurations that close apart (the confirmation "
                      f"does), and drift is judged outside that spread")

    def _flag_since_last_good(self, upto: int) -> list[int]:
        """Flag and re-queue the trials measured since the last good anchor."""
        good = self._last_good()
        return self._flag(good.after_trial if good is not None else -1, upto)

    def _rebase(self, number: int, runs: list[AnchorRun]) -> list[int]:
        """Two anchor runs in a row faster than the reference band: the reference was measured while the machine was
        slower (busy at the start), not the trials since. Those two runs become the reference, and the trials measured
        up to the old reference are flagged and queued again."""
        old = [a for a in self.state.anchors if (a.label == "start" or a.rebased) and not a.discarded]
        self.note(f"drift: the anchor ran {runs[0].ratio:.2f}× and {runs[1].ratio:.2f}× its reference, faster: "
                  f"the reference was measured while the machine was slower; it is replaced by these two runs")
        discarded, rebased = {a.index for a in old}, {a.index for a in runs}
        # the new reference keeps its label, ratio and drift as measured
        self._save(replace(self.state, anchors=tuple(
            replace(a, discarded=True) if a.index in discarded else replace(a, rebased=True) if a.index in rebased
            else a for a in self.state.anchors)))
        upto = max(a.after_trial for a in old)
        return self._flag(-1, upto)

    def _flag(self, since: int, upto: int) -> list[int]:
        """Flag the trials measured after `since` up to `upto` and queue them again; returns those queued. A
        re-measurement flagged again is not queued a third time: on a machine that stays busy that would never end."""
        already = flagged_trials(self.study)
        victims = [t for t in self._finished() if since < t.number <= upto and t.number not in already]
        if not victims:
            return []
        numbers = [t.number for t in victims]
        requeued = [t.number for t in victims if not t.is_remeasurement]
        self.study_store.write_study(drift_flagged=frozenset(already | set(numbers)))
        for t in victims:
            if t.number in requeued:
                self.study_store.enqueue(dict(t.params), remeasure_of=t.number)
        self._save(replace(self.state, events=(
            *self.state.events, DriftEvent(time.time(), upto, tuple(numbers), tuple(requeued)))))
        again = sorted(set(numbers) - set(requeued))
        self.note(f"drift: trials {', '.join(map(str, numbers))} flagged"
                  + (f"; {', '.join(map(str, requeued))} queued again" if requeued else "")
                  + (f"; {', '.join(map(str, again))} were re-measurements already and are not queued a third time"
                     if again else ""))
        return requeued

    def after_trial(self, number: int) -> None:
        """Measure the anchor when it is due (first successful trial, then every `every` finished trials)."""
        if not self.enabled:
            return
        anchors = self.state.anchors
        since = sum(1 for t in self._finished() if anchors and t.number > anchors[-1].after_trial)
        due = not anchors or since >= self.spec.every
        if not due:
            return
        if not self._reference():  # no successful anchor yet: these runs become the reference
            if self._config() is not None:
                self.measure_reference(number)
            return
        self.check(number, "periodic", backoff=True)

    def check(self, number: int, label: str, *, backoff: bool) -> list[int]:
        """An anchor run; outside the band, a second one at once decides whether the machine changed (both outside)
        or one process landed in another mode of it (the second back inside), which is noise, not drift. Returns
        the trials queued again."""
        entry = self.measure(number, label)
        if not entry.drifted:
            return []
        second = self.measure(number, "recheck")
        if not second.drifted:
            self.note("drift: a second anchor run is back inside the band; the first was one process's outlier")
            return []
        if all(a.ratio is not None and a.ratio > 1 for a in (entry, second)):
            return self._rebase(number, [entry, second])
        queued = self._flag_since_last_good(number)
        for attempt in range(self.spec.max_backoffs if backoff else 0):
            self.note(f"drift: waiting {self.spec.backoff_s:.0f} s before measuring the anchor again "
                      f"({attempt + 1}/{self.spec.max_backoffs})")
            time.sleep(self.spec.backoff_s)
            if not self.measure(number, "backoff").drifted:
                return queued
        if backoff:
            self.note("drift: the anchor did not recover; the campaign goes on and the next anchor decides again")
        return queued

    def finish(self) -> list[int]:
        """The end anchor, when trials ran since the last one; returns the trials it queued again (the sweep measures
        them before its confirmation)."""
        if not self.enabled or not self._reference():
            return []
        last = self.state.anchors[-1].after_trial
        after = [t.number for t in self._finished() if t.number > last]
        return self.check(max(after), "end", backoff=False) if after else []


def busy_verdict(study: optuna.Study) -> str | None:
    """A plain sentence when the machine's own noise dominated the study: most measured trials flagged, or most
    anchor runs after the reference outside its band. None otherwise."""
    study_store = Store(study)
    state = study_store.study_record().drift or DriftState()
    later = [a for a in state.anchors if a.label != "start" and a.label != "recheck"]
    measured = [t for t in study_store.records() if t.is_finished]
    flagged = flagged_trials(study) & {t.number for t in measured}
    drifted = sum(1 for a in later if a.drifted)
    if not (measured and len(flagged) * 2 > len(measured)) and not (len(later) >= 2 and drifted * 2 > len(later)):
        return None
    campaign = stored_campaign(study)
    policy = campaign.idle.policy if campaign else "warn"
    ratios = [a.ratio for a in later if a.ratio is not None]
    moved = f"the drift anchor ran at {min(ratios):.2f}–{max(ratios):.2f}× its reference; " if ratios else ""
    advice = ("stop the other programs and sweep again" if policy == "wait"
              else f"stop the other programs, or set idle.policy: wait (now {policy!r}) so trials wait for an idle "
                   "machine")
    return (f"this machine was too busy to measure on: {moved}{len(flagged)} of {len(measured)} measured trials were "
            f"flagged and {drifted} of {len(later)} anchor checks drifted; the numbers reflect the load, not the "
            f"configurations — {advice}")


def status_line(study: optuna.Study) -> str | None:
    """Anchor runs, drifts and flagged trials, for `autoinfer status`; None when no anchor ran."""
    anchors = (Store(study).study_record().drift or DriftState()).anchors
    if not anchors:
        return None
    ratios = [a.ratio for a in anchors if a.ratio is not None]
    drifts = sum(1 for a in anchors if a.drifted)
    flagged = sorted(flagged_trials(study))
    text = f"{sum(1 for a in anchors if a.trial is None)} anchor runs, {drifts} drifted"
    if ratios:
        text += f", ratio to the reference {min(ratios):.2f}–{max(ratios):.2f}"
    if flagged:
        text += f"; trials {', '.join(map(str, flagged))} flagged and re-queued"
    return text
