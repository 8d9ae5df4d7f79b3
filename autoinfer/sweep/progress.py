"""The sweep's live display: trial n/N, the configuration being measured, the recommendation so far ("best so
far", from campaign.recommend), ETA; a line per trial."""

from __future__ import annotations

import time
from typing import Any

from optuna.trial import FrozenTrial
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from autoinfer.campaign.spec import Campaign
from autoinfer.store import trials as store
from autoinfer.sweep.recommend import Recommendation


def describe(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "(fixed configuration)"


def trial_line(t: FrozenTrial) -> str:
    """One line per finished trial: number, outcome, medians, memory, reason."""
    outcome = store.outcome_of(t)
    parts = [f"trial {t.number:>3}", f"{outcome:<12}"]
    parts += [f"{key}={t.user_attrs[key]}" for key in store.ORIGIN_ATTRS if key in t.user_attrs]
    for kind in ("tg", "pp"):
        samples = store.samples_of(t, kind)
        if samples:
            parts.append(f"{kind} {sorted(samples)[len(samples) // 2]:8.2f} tok/s")
    vram, rss = t.user_attrs.get("vram_peak_mib"), t.user_attrs.get("rss_peak_mib")
    if vram:
        parts.append(f"vram {vram:.0f} MiB")
    if rss:
        parts.append(f"rss {rss:.0f} MiB")
    if outcome != "ok" and t.user_attrs.get("reason"):
        parts.append(f"— {t.user_attrs['reason'][:120]}")
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

    def finish(self, trial: FrozenTrial, best: Recommendation | None, *, counted: bool = True) -> None:
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
