"""The campaign file: a validated description of what to search, how to measure it and within which budgets.

A campaign file is YAML. Every key is checked; a bad file fails with one line naming the key and the fix, before
anything is stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoinfer.campaign.yaml_loader import load_yaml
from autoinfer.engines.knobs import Knob, context_knob, with_placement
from autoinfer.errors import UserError
from autoinfer.model.resolve import SYNTH_PREFIX
from autoinfer.store.trials import Store


class StrictModel(BaseModel):
    # finite numbers only: an infinite timeout or budget would be stored as null and fail when read back
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IntRange(StrictModel):
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "IntRange":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.log and self.low < 1:
            raise ValueError(f"a log range needs low >= 1 (got {self.low}); drop log: true or raise low")
        if self.log and self.step != 1:  # Optuna's log distributions take no step: it would be dropped unsaid
            raise ValueError(f"a log range takes no step (got step {self.step}); drop step or log: true")
        return self


class FloatRange(StrictModel):
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "FloatRange":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low}); drop log: true or raise low")
        return self


Scalar = Union[bool, int, float, str]
ParamSpec = Union[IntRange, FloatRange, list[Scalar], Scalar]

OBJECTIVES = ("tg", "pp")


class Budget(StrictModel):
    trials: int = Field(12, ge=1)
    wall_s: float | None = Field(None, gt=0)


class Constraints(StrictModel):
    vram_mib: float | None = Field(None, gt=0)
    ram_mib: float | None = Field(None, gt=0)
    max_kld: float | None = Field(None, gt=0)  # model files whose KL divergence (nats) is larger are infeasible

    @property
    def side(self) -> str | None:
        """The memory budget's side: "device" (vram_mib, which wins where both are set), "host" (ram_mib) or None.
        The serving context is counted there, and memory breaks a confirmation's tie there."""
        return "device" if self.vram_mib else "host" if self.ram_mib else None


class Quality(StrictModel):
    """How the quality of each model file is measured (autoinfer.llama.quality), when the campaign uses it."""

    reference: str | None = None  # file KLD is measured against; default: the highest-precision model file
    corpus: str | None = None  # UTF-8 text; default: the corpus shipped with autoinfer
    ctx: int = Field(256, ge=16)
    chunks: int | None = Field(None, ge=1)


class Measure(StrictModel):
    n_prompt: int = Field(64, ge=0)
    n_gen: int = Field(16, ge=0)
    repetitions: int = Field(3, ge=1)
    timeout_s: float = Field(300, gt=0)
    max_cv: float | None = Field(0.15, gt=0)  # spread (stdev/mean of the repetitions) a trial may have to count
    rerun_noisy: bool = True  # a trial over max_cv is measured once more; both runs' samples are pooled

    @model_validator(mode="after")
    def _something(self) -> "Measure":
        if self.n_prompt == 0 and self.n_gen == 0:
            raise ValueError("n_prompt and n_gen are both 0: nothing would be measured")
        return self


class Serve(StrictModel):
    """What the recommended llama-server must hold beyond what was measured."""

    # tokens of context (per slot) the printed server is started with (-c). llama-bench creates only the prompt's and
    # the generation's, so a memory budget counts the KV cache and attention mask of the rest from the model file on
    # top of each measured peak (search.context.SearchContext.context_growth); the deployment check measures the
    # server at it. None: the measurement's context, too short for a chat
    context: int | None = Field(None, ge=1)


class Sampler(StrictModel):
    name: Literal["tpe", "random"] = "tpe"
    seed: int | None = 0


class Search(StrictModel):
    """How the search uses the model and the memory budget (autoinfer.search.informed)."""

    informed: bool = True  # use the model and the budget (strategy below); false: the sampler alone
    # boundary: memory boundary, then local moves, then the sampler (autoinfer.search.boundary);
    # informed: the earlier fixed start (largest placement predicted to fit, its neighbours), then the sampler
    strategy: Literal["boundary", "informed"] = "boundary"
    neighbours: int = Field(4, ge=0)
    # measure llama-fit-params' answer for the same budget as a labelled baseline trial (asked again for less after
    # an overshoot, search/fit_baseline.py) and confirm it beside the leaders
    fit_params: bool = True
    skip_predicted: bool = True  # record configurations confidently over the budget as predicted_infeasible
    z: float = Field(2.0, ge=0)  # "confidently": the prediction minus z standard deviations is still over
    prune_below: float | None = Field(0.5, gt=0, lt=1)  # cut a trial whose first repetition is below this × best


class Confirm(StrictModel):
    """Final re-measurement of the top configurations, interleaved, in fresh processes (autoinfer.sweep.confirm)."""

    enabled: bool = True  # when the trial budget is spent; `autoinfer sweep --confirm` runs it on demand
    top_k: int = Field(3, ge=2)
    rounds: int = Field(5, ge=2)  # fresh runs per configuration; Mann-Whitney needs 4+ to ever see a difference
    alpha: float = Field(0.05, gt=0, lt=1)
    # paired: round by round (a drift that moves a whole round cancels); mannwhitney, welch: two samples
    test: Literal["paired", "mannwhitney", "welch"] = "paired"
    # in a tie, peaks within this fraction of the smallest count as the same memory and the fastest of them wins
    memory_tolerance: float = Field(0.02, ge=0, lt=1)
    # memory breaks a tie only between finalists within this fraction of the leader's speed (the ratio the test reads)
    speed_tolerance: float = Field(0.02, ge=0, lt=1)
    # more interleaved rounds while the leader/runner-up ratio's 95% CI is wider than ±precision, up to max_rounds
    precision: float = Field(0.03, gt=0, lt=1)
    max_rounds: int = Field(10, ge=2)

    @model_validator(mode="after")
    def _rounds_within_cap(self) -> "Confirm":
        if self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds {self.max_rounds} is below rounds {self.rounds}; raise max_rounds")
        return self


class Drift(StrictModel):
    """A fixed anchor configuration re-measured during the campaign (autoinfer.sweep.drift)."""

    every: int | None = Field(10, ge=1)  # trials between anchor runs; null turns the anchor off
    threshold: float = Field(0.2, gt=0, lt=1)  # relative change beyond the reference runs that counts as drift
    reference_runs: int = Field(3, ge=1)  # start runs of the anchor; their spread is the machine's own noise
    backoff_s: float = Field(30, ge=0)  # wait after a drift before measuring the anchor again
    max_backoffs: int = Field(3, ge=0)  # waits before the campaign goes on with the drift recorded
    baseline: dict[str, Scalar] = Field(default_factory=dict)  # overrides of the first OK trial's configuration


class Idle(StrictModel):
    """What to do when another program uses the GPU or the CPU before a trial (autoinfer.measure.idle)."""

    policy: Literal["wait", "warn", "refuse", "off"] = "warn"
    cpu_busy_percent: float = Field(50, gt=0, le=100)
    wait_s: float = Field(120, ge=0)


class InjectLoad(StrictModel):
    """A planted CPU load (busy-loop processes) during part of a campaign, to check the drift guard on one's own
    machine: the anchor after it must drift and the trials under it must be re-queued."""

    after_trial: int = Field(ge=0)  # the load starts before this trial number
    trials: int = Field(1, ge=1)  # and stops after this many trials
    processes: int = Field(2, ge=1)


class Workers(StrictModel):
    """Several workers on one study (autoinfer.coordination.worker): liveness of their trials and host sharing."""

    allow_concurrent_on_host: bool = False  # true: workers on one machine measure at the same time (hostlock)
    heartbeat_s: int = Field(10, ge=1)  # a running trial's heartbeat period on a shared (PostgreSQL) storage
    grace_s: int | None = Field(None, ge=1)  # no heartbeat for this long: the trial is failed and re-queued

    @model_validator(mode="after")
    def _grace(self) -> "Workers":
        if self.grace_s is not None and self.grace_s <= self.heartbeat_s:
            raise ValueError(f"grace_s ({self.grace_s}) must be longer than heartbeat_s ({self.heartbeat_s})")
        return self

    @property
    def grace(self) -> int:
        """Default: three missed heartbeats."""
        return self.grace_s if self.grace_s is not None else 3 * self.heartbeat_s


class Campaign(StrictModel):
    """A validated campaign. `space` maps parameter names to a fixed value, a list (categorical) or a range."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    engine: str = "llama-bench"
    engine_options: dict[str, Any] = Field(default_factory=dict)
    model: list[str]
    space: dict[str, ParamSpec] = Field(default_factory=dict)
    objective: Union[Literal["tg", "pp", "pareto"], dict[Literal["tg", "pp", "kld"], float]] = "tg"
    budget: Budget = Budget()
    constraints: Constraints = Constraints()
    quality: Quality = Quality()
    measure: Measure = Measure()
    serve: Serve = Serve()
    sampler: Sampler = Sampler()
    search: Search = Search()
    confirm: Confirm = Confirm()
    drift: Drift = Drift()
    idle: Idle = Idle()
    inject_load: InjectLoad | None = None
    workers: Workers = Workers()
    source: str | None = None  # the file it came from, for messages

    @field_validator("model", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("model")
    @classmethod
    def _some_model(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no model file given")
        return value

    @field_validator("objective")
    @classmethod
    def _weights(cls, value: Any) -> Any:
        if isinstance(value, dict):
            speed = [w for k, w in value.items() if k != "kld"]
            if not speed or any(w < 0 for w in value.values()) or sum(speed) <= 0:
                raise ValueError("weights must be non-negative and tg/pp not all zero, e.g. {tg: 0.7, pp: 0.3}")
        return value

    @model_validator(mode="after")
    def _one_context(self) -> "Campaign":
        if self.serve.context is not None and (knob := context_knob(self.engine)) in self.space:
            raise ValueError(f"the context is given twice (serve.context and space.{knob}); keep serve.context")
        return self

    def objective_weights(self) -> dict[str, float]:
        """{'tg': 1.0} for a plain objective; normalised weights for a mix; tg and pp balanced for pareto."""
        if self.objective == "pareto":
            return {"tg": 0.5, "pp": 0.5}
        if isinstance(self.objective, str):
            return {self.objective: 1.0}
        total = sum(v for k, v in self.objective.items() if k != "kld")
        weights = {k: v / total for k, v in self.objective.items() if v > 0 and k != "kld"}
        if self.objective.get("kld"):  # not normalised: the score is multiplied by exp(-weight · KLD)
            weights["kld"] = self.objective["kld"]
        return weights

    def searched(self) -> dict[str, ParamSpec]:
        """Parameters with more than one possible value (the ones Optuna suggests)."""
        out: dict[str, ParamSpec] = {}
        for name, spec in self.space.items():
            if isinstance(spec, (IntRange, FloatRange)) and spec.low != spec.high:
                out[name] = spec
            elif isinstance(spec, list) and len(spec) > 1:
                out[name] = spec
        if len(self.model) > 1:
            out["model"] = list(self.model)
        return out

    def fixed(self) -> dict[str, Any]:
        """Parameters with a single value, merged into every TrialConfig."""
        out: dict[str, Any] = {
            "n_prompt": self.measure.n_prompt,
            "n_gen": self.measure.n_gen,
            "repetitions": self.measure.repetitions,
        }
        if self.serve.context is not None:  # the engine's context knob; an engine without it measures a shorter one
            out[context_knob(self.engine)] = self.serve.context
        for name, spec in self.space.items():
            if isinstance(spec, (IntRange, FloatRange)) and spec.low == spec.high:
                out[name] = spec.low
            elif isinstance(spec, list) and len(spec) == 1:
                out[name] = spec[0]
            elif not isinstance(spec, (IntRange, FloatRange, list)):
                out[name] = spec
        if len(self.model) == 1:
            out["model"] = self.model[0]
        return out

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> "Campaign":
        """The campaign stored with a study (ValidationError or ValueError if the stored text is damaged)."""
        return cls.model_validate(json.loads(text))


def _values(spec: ParamSpec) -> list[Any]:
    if isinstance(spec, list):
        return spec
    if isinstance(spec, (IntRange, FloatRange)):
        return [spec.low, spec.high]
    return [spec]


def engines_with(name: str) -> list[str]:
    """Engines whose fixed parameter set includes `name` (engines whose set depends on their options are left out)."""
    from autoinfer.engines import base

    return [engine for engine in base.ENGINE_MODULES
            if (knobs := base.knobs_of(engine)) is not None and name in with_placement(knobs)]


def check_space(campaign: Campaign, knobs: Mapping[str, Knob]) -> None:
    """Every parameter must be one the engine takes and every value one it accepts (engines.knobs)."""
    knobs = with_placement(knobs)
    for name, spec in campaign.space.items():
        where = f"space.{name}"
        if name == "model":
            raise UserError(f"{where}: list model files under the top-level key 'model', not in space")
        if name not in knobs:
            others = engines_with(name)
            raise UserError(
                f"{where}: engine {campaign.engine!r} has no parameter {name!r}; "
                f"it supports: {', '.join(sorted(set(knobs) - {'model'}))}"
                + (f"; engines that have {name!r}: {', '.join(others)}" if others else "")
            )
        if isinstance(spec, list) and not spec:
            raise UserError(f"{where}: empty list; give at least one value")
        for value in _values(spec):
            if (problem := knobs[name].problem(value)) is not None:
                raise UserError(f"{where}: {problem}")


def pydantic_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "union[", "list[")))
    msg = err["msg"].removeprefix("Value error, ")  # a validator's own words
    if err["type"] == "extra_forbidden":
        msg = "unknown key; check the spelling against experiments/cpu-smoke.yaml"
    elif err["type"] == "missing":
        msg = "required key is missing"
    return f"{loc or 'campaign'}: {msg}"


def parse_campaign(data: Any, source: str = "<campaign>") -> Campaign:
    """Validate a loaded YAML document; raise UserError naming the bad key.

    The campaign is stored as JSON with its study and read back by status, export and resume, so a value that does
    not come back unchanged (a non-string key, a date in engine_options) is refused here, not after the sweep.
    """
    if not isinstance(data, dict):
        raise UserError(f"{source}: a campaign file must be a YAML mapping (name:, model:, space:, …)")
    try:
        campaign = Campaign.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise UserError(f"{source}: {pydantic_message(exc)}") from None
    try:
        stored = Campaign.from_json(campaign.to_json())
    except (ValidationError, ValueError) as exc:
        raise UserError(f"{source}: a value cannot be stored with the study ({str(exc).splitlines()[0]}); "
                        "use plain numbers, strings, lists and mappings with string keys") from None
    if stored != campaign:
        changed = next((k for k in Campaign.model_fields if getattr(stored, k) != getattr(campaign, k)), "campaign")
        raise UserError(f"{source}: {changed}: a value would change when stored with the study; use plain numbers, "
                        "strings, lists and mappings with string keys")
    return campaign


def load_campaign(path: Path, data: Any = None) -> Campaign:
    """Read and validate a campaign file (`data`: its YAML document when the caller has read it already). Relative
    model paths are taken relative to the file."""
    if data is None:
        if not path.is_file():
            raise UserError(f"campaign file {path} does not exist; see experiments/ for examples")
        data = load_yaml(path)
    campaign = parse_campaign(data, str(path))
    models = [m if m.startswith(SYNTH_PREFIX) or Path(m).is_absolute() else str((path.parent / m).resolve())
              for m in campaign.model]
    return campaign.model_copy(update={"model": models})


def stored_campaign(study: optuna.Study) -> Campaign | None:
    """The campaign the study was made with; UserError when the stored copy cannot be read."""
    text = Store(study).study_record().campaign
    if not text:
        return None
    try:
        return Campaign.from_json(text)
    except (ValidationError, ValueError, TypeError) as exc:
        raise UserError(f"study {study.study_name!r}: its stored campaign cannot be read "
                        f"({str(exc).splitlines()[0]}); start a new study with `autoinfer sweep FILE --study NEW_NAME`") \
            from None
