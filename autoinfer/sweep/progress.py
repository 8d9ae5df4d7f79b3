"""The sweep's live display: trial n/N, the configuration being measured, the recommendation so far ("best so
far", from campaign.recommend), ETA; a line per trial."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from autoinfer.campaign.spec import Campaign
from autoinfer.store.records import TrialRecord
from autoinfer.sweep.recommend import Recommendation


def describe(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "(fixed configuration)"


def trial_line(t: TrialRecord) -> str:
    """One line per finished trial: number, outcome, medians, memory, reason."""
    outcome = t.status
    parts = [f"trial {t.number:>3}", f"{outcome:<12}"]
    parts += [f"{key}={number}" for key, number in t.origin.items()]
    for kind in ("tg", "pp"):
        samples = t.samples(kind)
        if samples:
            parts.append(f"{kind} {sorted(samples)[len(samples) // 2]:8.2f} tok/s")
    if t.vram_peak_mib:
        parts.append(f"vram {t.vram_peak_mib:.0f} MiB")
    if t.rss_peak_mib:
        parts.append(f"rss {t.rss_peak_mib:.0f} MiB")
    if t.context_mib:  # counted on the budget's side
        parts.append(f"+{t.context_mib:.0f} MiB at the serving context")
    if outcome != "ok" and t.reason:
        parts.append(f"— {t.reason[:120]}")
    return "  ".join(parts)


class SweepProgress:
    def __init__(self, campaign: Campaign, study: str, *, enabled: bool, done: int, requeued: int) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.total = campaign.budget.trials
        self.done = done
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("[bold]{task.fields[study]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=not enabled,
        )
        self.task = self.progress.add_task("", total=self.total, completed=min(done, self.total), study=study)
        if enabled and (done or requeued):
            self.console.print(f"resuming study {study!r}: {done} trials done, {requeued} re-queued after a crash")

    def __enter__(self) -> "SweepProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def start(self, number: int, params: dict[str, Any]) -> None:
        self.progress.update(self.task, description=f"trial {number}: {describe(params)}")

    def finish(self, trial: TrialRecord, best: Recommendation | None, *, counted: bool = True) -> None:
        """Print the trial; the bar counts only trials charged to the budget (a rejected one or a drift
        re-measurement is not)."""
        if counted:
            self.progress.advance(self.task)
        if not self.enabled:
            return
        self.progress.console.print(trial_line(trial))
        if best is not None:
            self.progress.update(self.task, description=best.label())

    def settle(self, best: Recommendation | None) -> None:
        """After the confirmation: the bar's last words are the recommendation the summary gives, not the best search
        trial it showed while the search ran."""
        if best is not None:
            self.progress.update(self.task, description=f"recommended {best.speed:.2f} (trial {best.trial})")
