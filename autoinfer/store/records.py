"""The typed records of a study: what one trial carries (TrialRecord), what the study carries (StudyRecord), and
the structured parts of both (the confirmation, the drift anchor's state, the host of a trial, ...).

An attribute field of TrialRecord or StudyRecord is named as the Optuna user attribute it is stored under; those
names are the ones earlier versions wrote, so their studies read unchanged. `from_trial`/`from_attrs` read a record,
`to_attrs` gives the attributes that store it, `attrs_of` the attributes of some of its fields (a partial write).
Only autoinfer/store/ reads or writes Optuna user attributes (tests/store/test_store_only.py).
"""

from __future__ import annotations

import statistics
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime
from types import MappingProxyType
from typing import Any, Callable, Collection, Mapping

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autoinfer.engines.base import AS_RUN_KEYS, Decision, Outcome, TrialConfig
from autoinfer.model.placement import PLACEMENT_KEYS


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value or ())


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


def _attr(default: Any = None, *, factory: Callable[[], Any] | None = None, column: str | None = None,
          decode: Callable[[Any], Any] | None = None, encode: Callable[[Any], Any] | None = None) -> Any:
    """A field stored as a user attribute of its name. `column`: how the analysis table shows it ("value" as it is,
    "text" with None as "", "joined" a sequence joined by spaces); decode/encode: stored value ↔ field value."""
    meta = {"attr": True, "column": column, "decode": decode, "encode": encode}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _attr_fields(cls: type) -> dict[str, Any]:
    return {f.name: f for f in fields(cls) if f.metadata.get("attr")}


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def _decoders(cls: type) -> dict[str, Callable[[Any], Any]]:
    return {name: f.metadata["decode"] or _same for name, f in _attr_fields(cls).items()}


def _same(value: Any) -> Any:
    return value


def _decode(decoders: dict[str, Callable[[Any], Any]], attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Field values of the stored attributes this record knows (others, e.g. of a later version, are left out; a
    stored null leaves the field at its default)."""
    return {name: decoders[name](value) for name, value in attrs.items() if value is not None and name in decoders}


def _encode(specs: dict[str, Any], owner: str, values: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        f = specs.get(name)
        if f is None:
            raise TypeError(f"{owner} has no stored field {name!r}")
        encode = f.metadata["encode"]
        out[name] = encode(value) if encode is not None and value is not None else value
    return out


def _list(value: tuple[Any, ...]) -> list[Any]:
    return list(value)


# ----------------------------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class TrialHost:
    """The worker that measured a trial."""

    hostname: str
    pid: int | None = None
    hardware_class: str = ""
    cuda_visible_devices: str | None = None

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> TrialHost:
        return cls(str(data.get("hostname", "")), data.get("pid"), str(data.get("hardware_class") or ""),
                   data.get("cuda_visible_devices"))


@dataclass(frozen=True)
class Noise:
    """A trial whose samples spread more than measure.max_cv, measured once more: the first run's spread and
    samples, and how the second run ended."""

    first_cv: float
    max_cv: float
    rerun: bool
    first_tg_samples: tuple[float, ...] = ()
    first_pp_samples: tuple[float, ...] = ()
    rerun_outcome: str | None = None

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Noise:
        return cls(data.get("first_cv"), data.get("max_cv"), bool(data.get("rerun")),
                   _floats(data.get("first_tg_samples")), _floats(data.get("first_pp_samples")),
                   data.get("rerun_outcome"))

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "first_tg_samples": list(self.first_tg_samples),
                "first_pp_samples": list(self.first_pp_samples)}


#: Why a trial exists when it is not the search's own suggestion: each names the trial it measures again or answers.
ORIGINS = ("remeasure_of", "retry_of", "again_of", "repeat_of")


@dataclass(frozen=True)
class TrialRecord:
    """Everything one trial carries: Optuna's own fields, then the stored attributes (named as stored)."""

    number: int
    state: TrialState
    params: Mapping[str, Any] = field(default_factory=dict)
    values: tuple[float, ...] | None = None  # the objective value(s) told to Optuna
    constraints: Mapping[str, float] = field(default_factory=dict)  # > 0: violated
    distributions: Mapping[str, BaseDistribution] = field(default_factory=dict)
    datetime_start: datetime | None = None
    datetime_complete: datetime | None = None

    # the configuration measured (TrialConfig.to_params()) and the settings the engine imposed on it
    config: Mapping[str, Any] | None = _attr()
    imposed_settings: Mapping[str, Any] | None = _attr()
    # the measurement
    outcome: str | None = _attr()  # an Outcome value, or "repeat"; None until the trial is recorded
    reason: str = _attr("", column="value")
    engine_cmd: tuple[str, ...] = _attr(factory=tuple, column="joined", decode=_tuple, encode=_list)
    tg_samples: tuple[float, ...] = _attr(factory=tuple, decode=_floats, encode=_list)
    pp_samples: tuple[float, ...] = _attr(factory=tuple, decode=_floats, encode=_list)
    vram_peak_mib: float | None = _attr(column="value")  # the largest per-GPU peak
    vram_per_gpu_mib: tuple[float, ...] = _attr(factory=tuple, decode=_tuple, encode=_list)
    rss_peak_mib: float | None = _attr(column="value")
    # what the campaign's serving context adds to the peak on the budget's side (Campaign.serve, written before the
    # run); None where the measurement created that context itself
    context_mib: float | None = _attr(column="value")
    wall_s: float | None = _attr(column="value")
    engine_s: float | None = _attr(column="value")
    metrics: Mapping[str, Any] = _attr(factory=dict)  # engine-specific (signal, replay_row, ttft_ms, ...)
    stand_in: bool = _attr(False, column="value", decode=bool)  # another configuration's numbers (Measurement.stand_in)
    env: Mapping[str, Any] = _attr(factory=dict)  # the environment around the run (clocks, energy, build, model)
    # measurement hygiene
    idle: Mapping[str, Any] | None = _attr()  # the idle check before the run
    noise: Noise | None = _attr(decode=Noise.from_attr, encode=Noise.to_attr)
    stats: Mapping[str, Any] | None = _attr()  # per kind of sample: median, 95% CI, CV
    host_lock_wait_s: float | None = _attr(column="value")
    host: TrialHost | None = _attr(decode=TrialHost.from_attr, encode=asdict)
    # the search
    predicted_mib: float | None = _attr(column="value")  # the memory model's prediction when it was chosen
    predicted_std_mib: float | None = _attr(column="value")
    search_reason: str | None = _attr(column="text")  # why the search strategy chose it
    label: str | None = _attr(column="text")  # an informed start's role, or an imported row's label
    fit_override_tensors: tuple[str, ...] | None = _attr(decode=_tuple, encode=_list)  # llama-fit-params' -ot
    fit_tensor_split: str | None = _attr(column="text")  # llama-fit-params' -ts, as "a/b"
    # why it exists when the search did not suggest it (ORIGINS), and records made without a measurement
    remeasure_of: int | None = _attr(column="value")  # queued again: the drift anchor flagged that trial
    retry_of: int | None = _attr(column="value")  # queued again: the worker that ran that trial died
    again_of: int | None = _attr(column="value")  # measured again on purpose by the search
    repeat_of: int | None = _attr(column="value")  # answered with that trial's measurement, not run
    explore_after_repeats: int | None = _attr(column="value")  # queued at random after this many repeats in a row
    unmeasured: bool = _attr(False, column="value", decode=bool)  # recorded without running: costs no budget
    stale: bool = _attr(False, column="value", decode=bool)  # RUNNING when its process died; configuration re-queued
    # the model file's quality
    kld: float | None = _attr(column="value")
    ppl: float | None = _attr(column="value")
    kld_reference: str | None = _attr(column="text")
    # an imported row
    source_file: str | None = _attr(column="text")
    source_line: int | None = _attr(column="value")

    @classmethod
    def from_trial(cls, trial: FrozenTrial | optuna.Trial, attrs: Mapping[str, Any]) -> TrialRecord:
        """The record of a stored trial, or of a trial this process is running (state RUNNING, no values yet), with
        its stored attributes `attrs` (store.trials.record_of passes them: only it reads Optuna's user attributes).

        Filled in without the generated __init__: the loop and the search read every trial's record several times
        per trial, and that __init__ of 45 frozen fields took 8.6 µs where filling them in takes 1 µs (a record
        with every attribute set: 21 µs before, 10 µs now). Fields left at their default share one empty value,
        immutable (a MappingProxyType where the default is a mapping)."""
        finished = isinstance(trial, FrozenTrial)
        record = object.__new__(cls)
        record.__dict__.update(
            _TRIAL_BLANK, number=trial.number, state=trial.state if finished else TrialState.RUNNING,
            params=trial.params, values=tuple(trial.values) if finished and trial.values is not None else None,
            constraints=trial.constraints, distributions=trial.distributions, datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete if finished else None)
        record.__dict__.update(_decode(_TRIAL_DECODERS, attrs))
        return record

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes that store this record (fields at their default are left out)."""
        return attrs_of(**{name: getattr(self, name) for name, f in _TRIAL_ATTRS.items()
                           if getattr(self, name) != _default(f)})

    # -- what the loop, the search and the views ask of a trial ----------------------------------------------
    @property
    def status(self) -> str:
        """What `status` calls it: running, waiting, or its recorded outcome."""
        if self.state == TrialState.RUNNING:
            return "running"
        if self.state == TrialState.WAITING:
            return "waiting"
        return self.outcome or ("fail" if self.state == TrialState.FAIL else "unknown")

    @property
    def is_finished(self) -> bool:
        """Counts against the trial budget: ended, not a stale trial whose configuration was re-queued, and not one
        recorded without a measurement (predicted over the memory budget, over max_kld, refused by the engine)."""
        return self.state.is_finished() and not self.stale and not self.unmeasured

    @property
    def uses_budget(self) -> bool:
        """Uses up one of the campaign's trials: finished and counted (is_finished), or running somewhere now; a
        drift re-measurement never does."""
        return (self.state == TrialState.RUNNING or self.is_finished) and not self.is_remeasurement

    @property
    def is_remeasurement(self) -> bool:
        """A configuration queued again because the drift anchor flagged its measurement: it is measured before the
        campaign ends and does not count against the trial budget."""
        return self.remeasure_of is not None

    @property
    def is_feasible_ok(self) -> bool:
        return (self.state == TrialState.COMPLETE and self.outcome == Outcome.OK.value
                and all(v <= 0 for v in self.constraints.values()))

    def budget_peak(self, side: str) -> float | None:
        """The peak a memory budget on `side` ("device" or "host") holds it to: the measured one (the largest per-GPU
        one on a device), plus what the serving context adds (`context_mib`, counted on the budget's side)."""
        peak = self.rss_peak_mib if side == "host" else self.vram_peak_mib
        return None if peak is None else peak + (self.context_mib or 0.0)

    @property
    def value(self) -> float | None:
        """The single objective's value of a complete trial (None for a Pareto study's several values)."""
        return self.values[0] if self.values is not None and len(self.values) == 1 else None

    @property
    def shown_params(self) -> dict[str, Any]:
        """The parameters as they ran, for people: the knobs Engine.as_run may change (AS_RUN_KEYS) as llama.cpp ran
        them, and a trial running llama-fit-params' raw overrides names them in place of the placement parameters it
        carries only to be a point of the space (search/fit_baseline.py)."""
        ran = self.config or {}
        params = {**self.params, **{k: ran[k] for k in AS_RUN_KEYS if k in self.params and k in ran}}
        if self.fit_override_tensors is None:
            return params
        kept = {k: v for k, v in params.items() if k not in (*PLACEMENT_KEYS, "n_cpu_moe", "tensor_split")}
        split = {"tensor_split": self.fit_tensor_split} if self.fit_tensor_split is not None else {}
        return {"override_tensors": f"llama-fit-params' {len(self.fit_override_tensors)}", **split, **kept}

    @property
    def trial_config(self) -> TrialConfig:
        if self.config is None:
            raise ValueError(f"trial {self.number} has no configuration recorded")
        return TrialConfig.from_params(dict(self.config))

    def samples(self, kind: str) -> list[float]:
        """The raw per-repetition samples of one kind ("tg" or "pp")."""
        return list(self.tg_samples if kind == "tg" else self.pp_samples if kind == "pp" else ())

    @property
    def kld_samples(self) -> list[float]:
        """The model file's KLD as a one-value sample list (empty when its file has no quality measured)."""
        return [float(self.kld)] if self.kld is not None else []

    @property
    def origin(self) -> dict[str, int]:
        """The ORIGINS tags this trial carries: why it measures or answers another trial's configuration."""
        return {name: getattr(self, name) for name in ORIGINS if getattr(self, name) is not None}

    def columns(self) -> dict[str, Any]:
        """The stored scalars as analysis-table columns, by their stored names; the host as hostname and class."""
        out: dict[str, Any] = {}
        for name, f in _TRIAL_ATTRS.items():
            kind = f.metadata["column"]
            value = getattr(self, name)
            if kind == "text":
                out[name] = value if value is not None else ""
            elif kind == "joined":
                out[name] = " ".join(value)
            elif kind == "value":
                out[name] = value
        out["hardware_class"] = self.host.hardware_class if self.host else ""
        out["hostname"] = self.host.hostname if self.host else ""
        return out


_TRIAL_ATTRS = _attr_fields(TrialRecord)
_TRIAL_DECODERS = _decoders(TrialRecord)
_TRIAL_BLANK = {name: MappingProxyType({}) if f.default_factory is dict else _default(f)
                for name, f in _TRIAL_ATTRS.items()}


def attrs_of(**values: Any) -> dict[str, Any]:
    """The user attributes that store these TrialRecord fields (TypeError for a name the record does not have)."""
    return _encode(_TRIAL_ATTRS, "TrialRecord", values)


def waiting_remeasurements(records: list[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.state == TrialState.WAITING and r.is_remeasurement]


# ----------------------------------------------------------------------------------------------- the confirmation


@dataclass(frozen=True)
class Alternative:
    """A configuration that needs clearly less memory than the recommendation, offered beside it."""

    trial: int
    speed: float
    memory_mib: float  # with the serving context's share (context_mib), as the budget counts it
    slower: float  # fraction: 0.02 = 2% slower than the recommendation
    saves_mib: float
    context_mib: float = 0.0  # of memory_mib, what the serving context adds to the measured peak

    def line(self) -> str:
        pace = f"{self.slower:.0%} slower" if self.slower > 0 else f"{-self.slower:.0%} faster"
        context = f", {self.context_mib:.0f} of them for the serving context" if self.context_mib else ""
        return (f"lighter alternative: trial {self.trial}, {pace}, {self.saves_mib:.0f} MiB less "
                f"({self.speed:.2f} at {self.memory_mib:.0f} MiB{context})")


@dataclass(frozen=True)
class FinalistComparison:
    """The leader against one other finalist: the test, the ratio of medians with its CI, and Holm's verdict."""

    trial: int
    p_value: float
    differ: bool
    test: str
    ratio: float
    ratio_ci: tuple[float, float]
    differ_holm: bool

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> FinalistComparison:
        return cls(data["trial"], data["p_value"], data["differ"], data["test"], data["ratio"],
                   tuple(data["ratio_ci"]), data["differ_holm"])

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "ratio_ci": list(self.ratio_ci)}


@dataclass(frozen=True)
class Verdict:
    """What the interleaved runs decided (confirm.decide); every field None/empty when no finalist could be judged."""

    leader: int | None = None
    recommended: int | None = None
    tie: bool = False
    tied_with: tuple[int, ...] = ()
    comparisons: tuple[FinalistComparison, ...] = ()
    alternative: Alternative | None = None
    why: str | None = None

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Verdict:
        alt = data.get("alternative")
        return cls(data.get("leader"), data.get("recommended"), bool(data.get("tie")), tuple(data.get("tied_with") or ()),
                   tuple(FinalistComparison.from_attr(c) for c in data.get("comparisons") or ()),
                   Alternative(**alt) if alt else None, data.get("why"))

    def to_attr(self) -> dict[str, Any]:
        return {"leader": self.leader, "recommended": self.recommended, "tie": self.tie,
                "tied_with": list(self.tied_with), "comparisons": [c.to_attr() for c in self.comparisons],
                "alternative": asdict(self.alternative) if self.alternative else None, "why": self.why}


@dataclass(frozen=True)
class Finalist:
    """One configuration the confirmation re-measured: its per-run scores and their summary."""

    trial: int
    params: Mapping[str, Any]
    scores: tuple[float, ...]
    median: float | None
    ci: tuple[float, float] | None
    memory_mib: float | None  # the median measured peak on the budget's side (confirm.memory_of)
    memory_kind: str
    failed_runs: int
    context_mib: float | None = None  # what the serving context adds to memory_mib where memory breaks a tie

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Finalist:
        ci = data.get("ci")
        return cls(data["trial"], data.get("params") or {}, _floats(data.get("scores")), data.get("median"),
                   tuple(ci) if ci else None, data.get("memory_mib"), data.get("memory_kind", "none"),
                   data.get("failed_runs", 0), data.get("context_mib"))

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "params": dict(self.params), "scores": list(self.scores),
                "ci": list(self.ci) if self.ci is not None else None}


@dataclass(frozen=True)
class ConfirmRun:
    """One fresh-process run of a finalist in one round."""

    round: int
    trial: int
    outcome: str
    reason: str
    score: float | None
    tg_samples: tuple[float, ...]
    pp_samples: tuple[float, ...]
    vram_peak_mib: float | None
    rss_peak_mib: float | None
    idle_busy: bool

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> ConfirmRun:
        return cls(data["round"], data["trial"], data["outcome"], data.get("reason", ""), data.get("score"),
                   _floats(data.get("tg_samples")), _floats(data.get("pp_samples")), data.get("vram_peak_mib"),
                   data.get("rss_peak_mib"), bool(data.get("idle_busy")))

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "tg_samples": list(self.tg_samples), "pp_samples": list(self.pp_samples)}

    def samples(self, kind: str) -> tuple[float, ...]:
        return self.tg_samples if kind == "tg" else self.pp_samples


@dataclass(frozen=True)
class Confirmation:
    """The interleaved re-measurement of the finalists at the end of a sweep, and its verdict."""

    time: float | None
    alpha: float | None
    test: str | None
    rounds: int | None
    memory_tolerance: float | None
    speed_tolerance: float | None
    precision: float | None
    objective: Mapping[str, float]
    after_trials: int | None  # finished trials when it ran: a later sweep confirms again only after more trials
    finalists: tuple[Finalist, ...]
    runs: tuple[ConfirmRun, ...]
    verdict: Verdict

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Confirmation:
        return cls(data.get("time"), data.get("alpha"), data.get("test"), data.get("rounds"),
                   data.get("memory_tolerance"), data.get("speed_tolerance"), data.get("precision"),
                   data.get("objective") or {}, data.get("after_trials"),
                   tuple(Finalist.from_attr(f) for f in data.get("finalists") or ()),
                   tuple(ConfirmRun.from_attr(r) for r in data.get("runs") or ()), Verdict.from_attr(data))

    def to_attr(self) -> dict[str, Any]:
        return {"time": self.time, "alpha": self.alpha, "test": self.test, "rounds": self.rounds,
                "memory_tolerance": self.memory_tolerance, "speed_tolerance": self.speed_tolerance,
                "precision": self.precision, "objective": dict(self.objective), "after_trials": self.after_trials,
                "finalists": [f.to_attr() for f in self.finalists], "runs": [r.to_attr() for r in self.runs],
                **self.verdict.to_attr()}

    def finalist(self, trial: int) -> Finalist:
        return next(f for f in self.finalists if f.trial == trial)

    def run_medians(self, trials: Collection[int], kind: str) -> list[float]:
        """One median per fresh process that ran one of these trials ("tg" or "pp"): what a configuration's
        confirmed speed is the median of."""
        return [statistics.median(r.samples(kind)) for r in self.runs if r.trial in trials and r.samples(kind)]


# ----------------------------------------------------------------------------------------------- a contest


FIT_ANSWER = "llama-fit-params' answer"  # how a finalist that is llama.cpp's own fit is named beside its trial


@dataclass(frozen=True)
class ContestEntry:
    """One configuration in a contest's final: a trial of a contender's study, and the engine that ran it. `key` is
    its number in the final (the Confirmation's finalists and runs are keyed by it)."""

    key: int
    study: str
    engine: str
    trial: int
    baseline: bool = False  # llama-fit-params' answer, measured in the final as what the winner has to beat

    def label(self) -> str:
        return f"{self.study} trial {self.trial} ({self.engine}" + (f", {FIT_ANSWER})" if self.baseline else ")")


@dataclass(frozen=True)
class ContestRecord:
    """A contest's final: the contenders' finalists re-measured interleaved, the verdict, and what was left out."""

    contest: str  # the contest file as JSON
    entries: tuple[ContestEntry, ...]
    left_out: tuple[str, ...]  # contenders with no finalist, and why
    after_trials: Mapping[str, int]  # each contender study's finished trials when the final ran
    final: Confirmation | None  # None when fewer than two finalists were left

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> ContestRecord:
        final = data.get("final")
        return cls(data["contest"], tuple(ContestEntry(**e) for e in data.get("entries") or ()),
                   _tuple(data.get("left_out")), dict(data.get("after_trials") or {}),
                   Confirmation.from_attr(final) if final else None)

    def to_attr(self) -> dict[str, Any]:
        return {"contest": self.contest, "entries": [asdict(e) for e in self.entries], "left_out": list(self.left_out),
                "after_trials": dict(self.after_trials), "final": self.final.to_attr() if self.final else None}

    def entry(self, key: int) -> ContestEntry:
        return next(e for e in self.entries if e.key == key)

    def label(self, key: int) -> str:
        return self.entry(key).label()

    @property
    def winner(self) -> ContestEntry | None:
        """The recommended entry: the final's, or the only finalist when no final could run."""
        if self.final is not None:
            return self.entry(self.final.verdict.recommended) if self.final.verdict.recommended is not None else None
        return self.entries[0] if len(self.entries) == 1 else None


# ----------------------------------------------------------------------------------------------- the drift anchor


@dataclass(frozen=True)
class AnchorRun:
    """One run of the drift anchor (or, label "start" with `trial` set, a trial's own run counted as one)."""

    index: int
    label: str  # start | periodic | recheck | backoff | end
    after_trial: int
    score: float | None
    ratio: float | None  # score / the reference runs' median
    drifted: bool
    time: float | None = None
    outcome: str | None = None
    reason: str = ""
    tg_samples: tuple[float, ...] = ()
    pp_samples: tuple[float, ...] = ()
    idle_busy: bool = False
    trial: int | None = None
    rebased: bool = False  # one of the two runs that replaced a reference measured on a slower machine
    discarded: bool = False  # a reference run so replaced

    @classmethod
    def from_attr(cls, data: Mapping[str, Any], position: int) -> AnchorRun:
        return cls(data.get("index", position), data["label"], data["after_trial"], data.get("score"),
                   data.get("ratio"), bool(data.get("drifted")), data.get("time"), data.get("outcome"),
                   data.get("reason", ""), _floats(data.get("tg_samples")), _floats(data.get("pp_samples")),
                   bool(data.get("idle_busy")), data.get("trial"), bool(data.get("rebased")),
                   bool(data.get("discarded")))

    def to_attr(self) -> dict[str, Any]:
        data = {"index": self.index, "label": self.label, "after_trial": self.after_trial, "time": self.time,
                "outcome": self.outcome, "reason": self.reason, "score": self.score, "ratio": self.ratio,
                "drifted": self.drifted, "tg_samples": list(self.tg_samples), "pp_samples": list(self.pp_samples),
                "idle_busy": self.idle_busy, "trial": self.trial}
        data.update({k: True for k in ("discarded", "rebased") if getattr(self, k)})
        return data


@dataclass(frozen=True)
class DriftEvent:
    """Trials flagged after an anchor drifted, and those of them queued again."""

    time: float
    after_trial: int
    flagged: tuple[int, ...]
    requeued: tuple[int, ...]

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> DriftEvent:
        return cls(data["time"], data["after_trial"], _tuple(data.get("flagged")), _tuple(data.get("requeued")))

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "flagged": list(self.flagged), "requeued": list(self.requeued)}


@dataclass(frozen=True)
class DriftState:
    """The drift anchor of a study: its configuration (from which trial), every run, every flagging."""

    config: Mapping[str, Any] | None = None
    anchors: tuple[AnchorRun, ...] = ()
    from_trial: int | None = None
    events: tuple[DriftEvent, ...] = ()

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> DriftState:
        return cls(data.get("config"), tuple(AnchorRun.from_attr(a, i) for i, a in enumerate(data.get("anchors") or ())),
                   data.get("from_trial"), tuple(DriftEvent.from_attr(e) for e in data.get("events") or ()))

    def to_attr(self) -> dict[str, Any]:
        data: dict[str, Any] = {"config": dict(self.config) if self.config is not None else None,
                                "anchors": [a.to_attr() for a in self.anchors]}
        if self.from_trial is not None:
            data["from_trial"] = self.from_trial
        if self.events:
            data["events"] = [e.to_attr() for e in self.events]
        return data


# ----------------------------------------------------------------------------------------------- the study


@dataclass(frozen=True)
class HardwareClass:
    """The hardware class a study is bound to: its digest and the fields it was computed from."""

    digest: str
    fields: Mapping[str, Any]

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> HardwareClass:
        return cls(data["digest"], data.get("fields") or {})


@dataclass(frozen=True)
class DeploymentCheck:
    """One start of the recommended command: passed / failed (with why) / skipped (with why)."""

    status: str  # "passed" | "failed" | "skipped"
    reason: str
    trial: int | None
    command: str  # as printed, POSIX-quoted
    answer: str  # the start of the completion's text
    tokens: int  # tokens the server generated
    wall_s: float
    vram_peak_mib: float | None = None  # the server's peaks while it started and served (VRAM: on a GPU)
    rss_peak_mib: float | None = None
    memory: str = ""  # its peak against the sweep's measurement and the campaign's budget, in words
    over_budget: bool = False  # llama-server, run as printed, went over the campaign's memory budget
    prompt_tokens: int = 0  # the prompt's tokens (0: a check of an earlier version, which sent a 4-token text)
    program: str = "llama-server"  # what the printed command runs (the reference engine's: "generate")
    request: str = "/completion"  # what the check asked it for ("": a command that generates and exits)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_attr(self) -> dict[str, Any]:
        """Stored without the fields still at their default (a check of an earlier version had none of them)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.default is MISSING or getattr(self, f.name) != f.default}

    def line(self) -> str:
        """One line for status, the sweep's summary and the report."""
        memory = f"; {self.memory}" if self.memory else ""
        if self.status == "passed":
            prompt = f" to a {self.prompt_tokens}-token prompt" if self.prompt_tokens else ""
            did = " ".join(word for word in (self.program, "answered", self.request) if word)
            return (f"passed: {did}{prompt} with {self.tokens} tokens ({self.answer!r}) "
                    f"in {self.wall_s:.1f} s (trial {self.trial}){memory}")
        return (f"{self.status}: {self.reason}" + (f" (trial {self.trial})" if self.trial is not None else "")
                + memory)


@dataclass(frozen=True)
class ImportJunk:
    """A line of an imported file that held no result, and why."""

    file: str
    line: int | None
    reason: str


@dataclass(frozen=True)
class MemoryCalibration:
    """The memory model of one model file after calibration: on how many trials, and its error."""

    trials: int
    loo_median_rel_error: float | None
    noise_mib: float | None
    side: str | None  # "device" or "host"


def _decisions(data: Any) -> tuple[Decision, ...]:
    return tuple(Decision(d["knob"], d["value"], d["reason"]) for d in data)


def _calibrations(data: Mapping[str, Any]) -> dict[str, MemoryCalibration]:
    return {name: MemoryCalibration(c["trials"], c.get("loo_median_rel_error"), c.get("noise_mib"), c.get("side"))
            for name, c in data.items()}


def _sorted_list(value: frozenset[int]) -> list[int]:
    return sorted(value)


@dataclass(frozen=True)
class StudyRecord:
    """Everything a study carries besides its trials; each field is stored as the user attribute of its name."""

    campaign: str | None = _attr()  # the campaign's JSON (campaign.spec reads it)
    confirmed: Confirmation | None = _attr(decode=Confirmation.from_attr, encode=Confirmation.to_attr)
    drift: DriftState | None = _attr(decode=DriftState.from_attr, encode=DriftState.to_attr)
    drift_flagged: frozenset[int] = _attr(factory=frozenset, decode=lambda v: frozenset(int(n) for n in v),
                                          encode=_sorted_list)  # trials measured while the anchor had moved
    imposed_settings: tuple[Decision, ...] = _attr(factory=tuple, decode=_decisions,
                                                   encode=lambda v: [asdict(d) for d in v])
    hardware_class: HardwareClass | None = _attr(decode=HardwareClass.from_attr, encode=asdict)
    deployment_check: DeploymentCheck | None = _attr(decode=lambda v: DeploymentCheck(**v),
                                                      encode=DeploymentCheck.to_attr)
    imported_files: tuple[str, ...] = _attr(factory=tuple, decode=_tuple, encode=_list)
    import_junk: tuple[ImportJunk, ...] = _attr(factory=tuple, decode=lambda v: tuple(ImportJunk(**j) for j in v),
                                                encode=lambda v: [asdict(j) for j in v])
    memory_model: Mapping[str, MemoryCalibration] = _attr(factory=dict, decode=_calibrations,
                                                          encode=lambda v: {k: asdict(c) for k, c in v.items()})
    search_notes: tuple[str, ...] = _attr(factory=tuple, decode=_tuple, encode=_list)  # what the informed start did
    pareto_front: tuple[int, ...] | None = _attr(decode=_tuple, encode=_list)  # trial numbers, `objective: pareto`
    contest: ContestRecord | None = _attr(decode=ContestRecord.from_attr, encode=ContestRecord.to_attr)
    stopped: str | None = _attr()  # why the last sweep on this study ended (sweep/runner.py), for `status`

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StudyRecord:
        return cls(**_decode(_STUDY_DECODERS, attrs))

    def to_attrs(self) -> dict[str, Any]:
        return study_attrs_of(**{name: getattr(self, name) for name, f in _STUDY_ATTRS.items()
                                 if getattr(self, name) != _default(f)})


_STUDY_ATTRS = _attr_fields(StudyRecord)
_STUDY_DECODERS = _decoders(StudyRecord)


def study_attrs_of(**values: Any) -> dict[str, Any]:
    """The user attributes that store these StudyRecord fields."""
    return _encode(_STUDY_ATTRS, "StudyRecord", values)
