"""`autoinfer replay TABLE`: compare search strategies offline on a table of measured configurations.

Each strategy runs the real campaign loop (engine "replay", an in-memory study) once per seed; a run has found the
answer at the first measured trial whose configuration is, by the table, feasible and within 98% of the best
feasible row. Predicted-infeasible records are not measurements and are not counted. A run is also scored by its
answer after the first ANSWER_AT measured trials: what the configuration it measured fastest by then is worth, as a
share of the best feasible row. Where a search takes longer than that to reach 98%, this says what stopping there
costs (a flat table's near-ties cost little; a missed region much).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from autoinfer.errors import UserError

STRATEGIES = ("random", "tpe", "informed", "boundary")
KNOWING = ("informed", "boundary")  # strategies that use the memory and performance models
TARGET = 0.98
ANSWER_AT = 12  # measured trials after which the answer is scored: the trial target the searches are held to
# A table needs no machine hygiene: no idle wait, no drift anchor, no confirmation runs, no re-run of noisy rows.
OFFLINE = {"idle": {"policy": "off"}, "drift": {"every": None}, "confirm": {"enabled": False},
           "measure": {"rerun_noisy": False}}


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    trials_needed: tuple[int | None, ...]  # per seed; None: not reached within the trial budget
    skipped: tuple[int, ...]  # records made without a measurement per seed (predicted infeasible, repeats)
    wall_s: float  # seconds its runs took, summed (runs made in parallel overlap)
    budget: int  # measured-trial budget of each run
    #: per seed, trials until a row within 98% of the best noise-free value (tables whose generator knows it)
    trials_needed_noise_free: tuple[int | None, ...] | None = None
    #: per seed, what the answer after ANSWER_AT measured trials is worth: see SeedRun.answer
    answer: tuple[float | None, ...] = ()
    #: per seed, measured trials over the memory budget among the first ANSWER_AT: see SeedRun.over
    over: tuple[int, ...] = ()

    @property
    def median(self) -> float:
        """Median trials needed; a seed that never reached the target counts as budget + 1."""
        return _median(self.trials_needed, self.budget)

    @property
    def median_noise_free(self) -> float | None:
        return None if self.trials_needed_noise_free is None else _median(self.trials_needed_noise_free, self.budget)

    @property
    def answer_median(self) -> float | None:
        """Median over seeds of the answer's worth (answer_worth)."""
        return statistics.median(answer_worth(self.answer)) if self.answer else None


class SeedRun(NamedTuple):
    """One simulated campaign, scored."""

    needed: int | None  # measured trials to the first row within 98% of the best feasible row
    skipped: int  # records made without a measurement (predicted infeasible, answered repeats)
    needed_noise_free: int | None  # the same against the noise-free values (None without them)
    #: the recommendation after the first ANSWER_AT measured trials (as `autoinfer status` would give it, not
    #: confirmed), by its row's noise-free value (else its row's value) over the best feasible one; None where no
    #: feasible trial had succeeded by then. What a user who stopped there would run, not what a search found.
    answer: float | None
    #: measured trials over the memory budget (or out of memory) among the first ANSWER_AT: what finding the
    #: boundary by measuring costs where a placement predicted near it ran over. Not those replayed from another
    #: configuration's row (Measurement.stand_in): that row's peak is not theirs.
    over: int


def _median(needed: tuple[int | None, ...], budget: int) -> float:
    return statistics.median(n if n is not None else budget + 1 for n in needed)


def _space(df: pd.DataFrame, params: list[str]) -> dict:
    """Each parameter column as a campaign parameter: evenly spaced integers → a range, anything else → a list."""
    space = {}
    for col in params:
        values = sorted(df[col].dropna().unique().tolist(), key=lambda v: (str(type(v)), v))
        ints = all(isinstance(v, (int,)) or (isinstance(v, float) and v.is_integer()) for v in values)
        if ints and len(values) > 2:
            ivalues = [int(v) for v in values]
            steps = {b - a for a, b in zip(ivalues, ivalues[1:])}
            if len(steps) == 1:
                space[col] = {"low": ivalues[0], "high": ivalues[-1], "step": steps.pop()}
                continue
            values = ivalues
        space[col] = [int(v) if ints else v for v in values] if len(values) > 1 else values[0]
    return space


def truth(df: pd.DataFrame, objective: str, budget_mib: float | None, values: pd.DataFrame | None = None) -> pd.Series:
    """The table's objective per row (NaN where infeasible or failed); from `values` (tg/pp per row, e.g. a
    generator's noise-free ones) instead of the table's own columns when given. In a table of several processes per
    configuration (a `process` column) every row is worth its configuration's median over its successful processes,
    and its peak is their median: the best configuration, not the luckiest process, sets the target."""
    from autoinfer.engines.replay import configurations

    values = df if values is None else values
    score = values[objective] if objective in ("tg", "pp") else (values["tg"] * values["pp"]) ** 0.5
    ok = df["outcome"].fillna("ok").eq("ok") if "outcome" in df else pd.Series(True, index=df.index)
    mem = df["vram_mib"] if "vram_mib" in df else df.get("rss_mib")
    if "process" in df:
        config = configurations(df)
        score = score.where(ok).groupby(config).transform("median")
        ok = score.notna()
        mem = None if mem is None else mem.groupby(config).transform("median")
    if budget_mib is not None and mem is not None:
        ok &= mem <= budget_mib
    return score.where(ok)


@contextmanager
def _scratch_results() -> Iterator[None]:
    """Trial artifacts of simulated studies go to a temporary folder, not the user's results."""
    old = os.environ.get("AUTOINFER_RESULTS")
    with tempfile.TemporaryDirectory(prefix="autoinfer-replay-") as tmp:
        os.environ["AUTOINFER_RESULTS"] = tmp
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("AUTOINFER_RESULTS", None)
            else:
                os.environ["AUTOINFER_RESULTS"] = old


def check_strategies(strategies: list[str]) -> None:
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise UserError(f"--sampler {bad[0]!r} is not one of {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class Goals:
    """What a simulated run on one table and budget is scored against, from one read of the table."""

    df: pd.DataFrame
    target: pd.Series  # the objective per row, NaN where infeasible or failed
    reference: pd.Series | None  # the same from noise-free values (tables whose generator knows them)

    @property
    def best(self) -> float:
        return float(self.target.max())


def goals(table: Path, objective: str, budget_mib: float | None, noise_free: pd.DataFrame | None = None) -> Goals:
    """The table's targets at a budget; a one-line error where the table cannot answer the question."""
    from autoinfer.engines.replay import read_table

    if objective not in ("tg", "pp", "balanced"):
        raise UserError(f"--objective {objective!r} is not one of tg, pp, balanced")
    df = read_table(table)
    missing = [c for c in (("tg", "pp") if objective == "balanced" else (objective,)) if c not in df]
    if missing:
        raise UserError(f"replay table {table} has no {missing[0]!r} column for --objective {objective}; "
                        f"use --objective {'pp' if 'pp' in df else 'tg'}")
    target = truth(df, objective, budget_mib)
    if target.notna().sum() == 0:
        raise UserError(f"no row of {table} is feasible within {budget_mib} MiB; raise the memory budget")
    if noise_free is not None and len(noise_free) != len(df):
        raise UserError(f"noise-free values for {table} have {len(noise_free)} rows, the table {len(df)}")
    reference = truth(df, objective, budget_mib, noise_free) if noise_free is not None else None
    return Goals(df, target, reference)


def run_seed(table: Path, strategy: str, seed: int, budget_mib: float | None, trials: int, objective: str,
             scored: Goals, fresh_noise: bool = False) -> SeedRun:
    """One simulated campaign, scored. Seeds are independent, so callers may run them in parallel. fresh_noise:
    each run a new process's draw around the row's noise-free value (a generated table's; engines/replay.py)."""
    from autoinfer.campaign.spec import parse_campaign
    from autoinfer.engines.replay import parameter_columns
    from autoinfer.store.trials import MEMORY_STORAGE, Store
    from autoinfer.sweep.runner import sweep

    check_strategies([strategy])
    df = scored.df
    memory_key = "vram_mib" if "vram_mib" in df else "ram_mib"
    campaign = parse_campaign({
        "name": f"replay-{strategy}-{seed}", "engine": "replay",
        "engine_options": {"table": str(Path(table).resolve()), "seed": seed, "fresh_noise": fresh_noise},
        "model": str(table), "space": _space(df, parameter_columns(df)),
        "objective": "tg" if objective == "tg" else "pp" if objective == "pp" else {"tg": 1, "pp": 1},
        "budget": {"trials": trials}, "constraints": {} if budget_mib is None else {memory_key: budget_mib},
        "sampler": {"name": "random" if strategy == "random" else "tpe", "seed": seed},
        "search": {"informed": strategy in KNOWING, "skip_predicted": strategy in KNOWING,
                   "strategy": strategy if strategy in KNOWING else "boundary",
                   "fit_params": False, "prune_below": 0.5 if strategy in KNOWING else None},
        **OFFLINE,
    }, str(table))
    with _scratch_results():
        study = sweep(campaign, storage=MEMORY_STORAGE, progress=False).study
    records = sorted(Store(study).records(), key=lambda t: t.number)
    needed, skipped = _trials_to_target(records, scored.target, TARGET * scored.best)
    free = None if scored.reference is None else \
        _trials_to_target(records, scored.reference, TARGET * scored.reference.max())[0]
    worth = scored.reference if scored.reference is not None else scored.target
    first = [t for t in records if not t.unmeasured][:ANSWER_AT]
    over = sum(not t.stand_in and any(t.constraints.get(key, 0) > 0 for key in ("vram_mib", "ram_mib", "memory"))
               for t in first)
    return SeedRun(needed, skipped, free, _answer(first, worth, campaign.objective_weights()), over)


def strategy_result(strategy: str, runs: list[SeedRun], wall_s: float, trials: int,
                    noise_free: bool) -> StrategyResult:
    """The seeds' runs (run_seed's answers, in seed order) of one strategy as one result."""
    return StrategyResult(strategy, tuple(r.needed for r in runs), tuple(r.skipped for r in runs), wall_s, trials,
                          tuple(r.needed_noise_free for r in runs) if noise_free else None,
                          tuple(r.answer for r in runs), tuple(r.over for r in runs))


def compare(table: Path, strategies: list[str], seeds: int, budget_mib: float | None, trials: int,
            objective: str = "tg", noise_free: pd.DataFrame | None = None) -> tuple[list[StrategyResult], float]:
    """Run every strategy over `seeds` seeds; returns the results and the best feasible row's value. With
    `noise_free` (tg/pp of every row before noise, as a synthetic table's generator knows them) each run is also
    scored against 98% of the best feasible noise-free value, which no lucky row can lift."""
    import time

    check_strategies(strategies)  # all of them before the first run
    scored = goals(table, objective, budget_mib, noise_free)
    results = []
    for strategy in strategies:
        started = time.monotonic()
        runs = [run_seed(table, strategy, seed, budget_mib, trials, objective, scored) for seed in range(seeds)]
        results.append(strategy_result(strategy, runs, time.monotonic() - started, trials, noise_free is not None))
    return results, scored.best


def _answer(first: list, worth: pd.Series, weights: dict[str, float]) -> float | None:
    """The worth of the recommendation from a simulated study's first ANSWER_AT measured trials (their records in
    trial order), over the best feasible worth (SeedRun.answer)."""
    from autoinfer.sweep.recommend import decide, runs_of

    measured = {t.number: t for t in first}
    rec = decide(runs_of(measured.values(), weights, set()), None, {},
                 {n: t.config for n, t in measured.items() if t.config is not None})
    if rec is None:
        return None
    row = measured[rec.trial].metrics.get("replay_row")
    return None if row is None else float(worth.iloc[row] / worth.max())


def _trials_to_target(records: list, target: pd.Series, goal: float) -> tuple[int | None, int]:
    """(measured trials until one reached the goal, records made without a measurement: predicted infeasible,
    answered repeats) for a simulated study's records in trial order."""
    measured = 0
    skipped = 0
    reached = None
    for t in records:
        if t.unmeasured:
            skipped += 1
            continue
        measured += 1
        row = t.metrics.get("replay_row")
        if reached is None and t.outcome == "ok" and row is not None and not pd.isna(target.iloc[row]) \
                and target.iloc[row] >= goal:
            reached = measured
    return reached, skipped


def register(app: typer.Typer) -> None:
    app.command()(replay)


def replay(
    table: Path = typer.Argument(..., help="CSV of measured configurations (benchmarks/make_table.py)."),
    sampler: str = typer.Option(",".join(STRATEGIES), "--sampler", help="Strategies, comma-separated: "
                                "random, tpe, informed, boundary."),
    seeds: int = typer.Option(20, "--seeds", min=1, help="Runs per strategy (seeds 0..N-1)."),
    budget_mib: Optional[float] = typer.Option(None, "--budget-mib", min=1, help="Memory budget in MiB."),
    trials: int = typer.Option(60, "--trials", min=1, help="Measured-trial budget of each run."),
    objective: str = typer.Option("tg", "--objective", help="tg | pp | balanced"),
) -> None:
    """Median number of trials each search strategy needs to reach 98% of the table's best feasible row, and what
    its answer after 12 trials is worth."""
    results, best = compare(table, [s.strip() for s in sampler.split(",") if s.strip()], seeds, budget_mib, trials,
                            objective)
    print_results(Console(), results, best, objective)


def print_results(console: Console, results: list[StrategyResult], best: float, objective: str) -> None:
    out = Table(title=f"trials to reach {TARGET:.0%} of the best feasible row ({objective} {best:.2f})")
    free = any(r.trials_needed_noise_free is not None for r in results)
    for col in ("strategy", "median trials", "reached", "range", *(["noise-free median"] if free else []),
                "not run (median)", "wall s"):
        out.add_column(col)
    for r in results:
        reached = [n for n in r.trials_needed if n is not None]
        out.add_row(r.strategy, _shown(r.median, r.budget), f"{len(reached)}/{len(r.trials_needed)}",
                    f"{min(reached)}–{max(reached)}" if reached else "—",
                    *([_shown(r.median_noise_free, r.budget)] if free else []),
                    f"{statistics.median(r.skipped):g}", f"{r.wall_s:.1f}")
    console.print(out)
    console.print(f"answer after {ANSWER_AT} trials, or all of a shorter run (the fastest configuration measured by "
                  f"then, unconfirmed, as a share of the best feasible row's {'noise-free ' if free else ''}"
                  f"{objective}; median over seeds and the worst seed): " + ", ".join(f"{r.strategy} {answer_shown(r.answer)}" for r in results))


def answer_worth(answers: Iterable[float | None]) -> list[float]:
    """SeedRun.answer per seed, a seed with no feasible trial by then counting as 0."""
    return [a or 0.0 for a in answers]


def answer_shown(answers: tuple[float | None, ...]) -> str:
    """Median and worst seed of SeedRun.answer, in percent (answer_worth)."""
    if not answers:
        return "—"
    worth = answer_worth(answers)
    return f"{statistics.median(worth):.1%} ({min(worth):.1%})"


def _shown(median: float | None, trials: int) -> str:
    """A median, or '>N' where half the seeds never reached the target."""
    return "—" if median is None else f"{median:g}" if median <= trials else f">{trials}"
