"""A contest (campaign/contest.py): every contender's campaign runs as its own study, then a final re-measures each
contender's best configurations interleaved in fresh processes, so llama.cpp's configurations and the reference
engine's are ranked by one test on the same machine state, and one of them is recommended.

The contest has a study of its own (no trials) whose record holds the final (StudyRecord.contest); `status` and
`export` read the winner from it. A contest run again re-runs the final only when a contender measured something
new since (or with `--confirm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import optuna

from autoinfer.campaign.contest import Contest
from autoinfer.campaign.spec import Campaign, stored_campaign
from autoinfer.coordination import hostlock
from autoinfer.engines import base
from autoinfer.engines.base import Measurement
from autoinfer.errors import UserError
from autoinfer.paths import default_storage, results_dir
from autoinfer.search.fit_baseline import is_fit_trial
from autoinfer.store import trials as store
from autoinfer.store.records import Confirmation, ContestEntry, ContestRecord, TrialRecord
from autoinfer.store.redact import redact_url
from autoinfer.store.trials import Store
from autoinfer.sweep.confirm import finalists, interleave, judge
from autoinfer.sweep.guard import TrialGuard
from autoinfer.sweep.recommend import recommend
from autoinfer.sweep.runner import sqlite_single_worker
from autoinfer.sweep.runner import sweep as run_sweep


@dataclass(frozen=True)
class ContestResult:
    study: optuna.Study  # the contest's own study
    record: ContestRecord


def run_contest(contest: Contest, campaigns: list[Campaign], *, storage: str | None = None,
                trials: int | None = None, wall_s: float | None = None, progress: bool = True,
                confirm: bool = False, note: Callable[[str], None] = print) -> ContestResult:
    """Sweep every contender (`trials` and `wall_s` apply to each), then run the final unless it is up to date."""
    url = storage or default_storage()
    studies: dict[str, optuna.Study] = {}
    for campaign in campaigns:
        note(f"contender {campaign.name} (engine {campaign.engine})")
        studies[campaign.name] = run_sweep(campaign, study_name=campaign.name, storage=url, trials=trials,
                                           wall_s=wall_s, progress=progress, confirm=confirm).study
        rec = recommend(studies[campaign.name])
        note(f"contender {campaign.name}: " + (rec.headline() if rec else "no feasible successful trial"))
    with sqlite_single_worker(url, contest.name):
        study = open_contest_study(contest, url)
        after = {name: sum(1 for t in Store(s).records() if t.is_finished) for name, s in studies.items()}
        previous = Store(study).study_record().contest
        if (not confirm and previous is not None and previous.contest == contest.to_json()
                and dict(previous.after_trials) == after):
            note("contest: no contender measured anything since the final; the stored final stands")
            return ContestResult(study, previous)
        record = final(contest, campaigns, studies, after, note)
        Store(study).write_study(contest=record)
    return ContestResult(study, record)


def open_contest_study(contest: Contest, url: str) -> optuna.Study:
    """The contest's own study; a campaign's study of the same name is refused, not overwritten."""
    study = optuna.create_study(study_name=contest.name, storage=store.storage_for(url), direction="maximize",
                                load_if_exists=True)
    if stored_campaign(study) is not None or study.trials:
        raise UserError(f"study {contest.name!r} in {redact_url(url)} belongs to a campaign, not a contest; give the "
                        "contest another `name:`")
    return study


def contender_finalists(study: optuna.Study, campaign: Campaign, count: int) -> list[TrialRecord]:
    """A contender's best `count` configurations: its recommendation first (confirmed when its campaign confirmed),
    then its next-best distinct configurations; and beside them llama-fit-params' answer where the contender measured
    one within the budget, so the final says how much faster than llama.cpp's own fit the winner ran."""
    rec = recommend(study)
    if rec is None:
        return []
    chosen = [Store(study).record(rec.trial)]
    ranked = finalists(study, campaign.objective_weights(), count + 1)
    for t in ranked:
        if len(chosen) < count and t.config != chosen[0].config:
            chosen.append(t)
    baseline = next((t for t in ranked if is_fit_trial(t)), None)
    if baseline is not None and all(t.config != baseline.config for t in chosen):
        chosen.append(baseline)
    return chosen


def final(contest: Contest, campaigns: list[Campaign], studies: dict[str, optuna.Study], after: dict[str, int],
          note: Callable[[str], None]) -> ContestRecord:
    """The contenders' finalists re-measured interleaved, and the verdict (every finalist runs in every round)."""
    entries: list[ContestEntry] = []
    configs: dict[int, TrialRecord] = {}
    left_out: list[str] = []
    for campaign in campaigns:
        chosen = contender_finalists(studies[campaign.name], campaign, contest.finalists)
        if not chosen:
            left_out.append(f"{campaign.name}: no feasible successful trial")
            note(f"contest: {campaign.name} has no feasible successful trial; it is left out of the final")
        for t in chosen:
            configs[len(entries)] = t
            entries.append(ContestEntry(len(entries), campaign.name, campaign.engine, t.number, is_fit_trial(t)))
    base_record = ContestRecord(contest.to_json(), tuple(entries), tuple(left_out), after, None)
    if len(entries) < 2:
        note(f"contest: {len(entries)} finalist(s); no final to run")
        return base_record
    by_name = {c.name: c for c in campaigns}
    guards = {c.name: TrialGuard(studies[c.name], c, _engine(c), note) for c in campaigns}
    locks = {c.name: hostlock.for_campaign(c.engine, c.workers.allow_concurrent_on_host, note) for c in campaigns}
    folder = results_dir() / contest.name / "final"
    spec = contest.confirm
    baseline = next((e.label() for e in entries if e.baseline), None)
    note(f"contest final: {len(entries)} finalists of {len(campaigns) - len(left_out)} contenders"
         + (f" ({baseline} is the baseline)" if baseline else "") + ", "
         f"{spec.rounds} interleaved rounds in fresh processes (up to {spec.max_rounds} while the leaders' ratio "
         f"is wider than ±{spec.precision:.0%})")

    def run(key: int, r: int) -> Measurement:
        entry = entries[key]
        with locks[entry.study]:
            return guards[entry.study].extra_run(configs[key].trial_config,
                                                 folder / f"round{r}-{entry.study}-trial{entry.trial}")

    weights = by_name[entries[0].study].objective_weights()
    runs, rounds = interleave(list(configs), run, spec, weights, note)
    record = ContestRecord(contest.to_json(), tuple(entries), tuple(left_out), after,
                           judge({k: t.config or {} for k, t in configs.items()}, runs, rounds, spec, weights, None,
                                 label=base_record.label, side=by_name[entries[0].study].constraints.side,
                                 context={k: t.context_mib for k, t in configs.items()}))
    return record


def _engine(campaign: Campaign) -> base.Engine:
    engine = base.create(campaign.engine, **campaign.engine_options)
    engine.check()
    return engine


def contest_of(study: optuna.Study) -> ContestRecord | None:
    """The final stored on a contest's study (None for a campaign's study)."""
    return Store(study).study_record().contest


def winner(study: optuna.Study, record: ContestRecord,
           storage: str | None) -> tuple[optuna.Study, Campaign, store.Best] | None:
    """The recommended configuration: the contender's study, its campaign and the configuration to export."""
    entry = record.winner
    if entry is None:
        return None
    member = store.load_study(entry.study, storage)
    campaign = stored_campaign(member)
    if campaign is None:
        raise UserError(f"contest {study.study_name!r}: study {entry.study!r} has no stored campaign; run the "
                        "contest again")
    t = Store(member).record(entry.trial)
    return member, campaign, store.Best(t, t.trial_config, _speed(record.final, entry, t), confirmation=None)


def _speed(final_record: Confirmation | None, entry: ContestEntry, t: TrialRecord) -> float:
    if final_record is not None and (median := final_record.finalist(entry.key).median) is not None:
        return median
    return t.value if t.value is not None else float("nan")

