"""The campaign file: a validated description of what to search, how to measure it and within which budgets.

A campaign file is YAML. Every key is checked; a bad file fails with one line naming the key and the fix, before
anything is stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoinfer.engines.base import FLASH_ATTN, KV_TYPES, LOAD_MODES, TrialConfig
from autoinfer.errors import UserError

SYNTH_PREFIX = "synth:"  # "synth:tiny" or "synth:tiny/Q4_0": a synthetic model made (and cached) on first use


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(_Strict):
    low: int
    high: int
    step: int = 1
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "IntRange":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


class FloatRange(_Strict):
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "FloatRange":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


Scalar = Union[bool, int, float, str]
ParamSpec = Union[IntRange, FloatRange, list[Scalar], Scalar]

OBJECTIVES = ("tg", "pp")


class Budget(_Strict):
    trials: int = Field(12, ge=1)
    wall_s: float | None = Field(None, gt=0)


class Constraints(_Strict):
    vram_mib: float | None = Field(None, gt=0)
    ram_mib: float | None = Field(None, gt=0)


class Measure(_Strict):
    n_prompt: int = Field(64, ge=0)
    n_gen: int = Field(16, ge=0)
    repetitions: int = Field(3, ge=1)
    timeout_s: float = Field(300, gt=0)

    @model_validator(mode="after")
    def _something(self) -> "Measure":
        if self.n_prompt == 0 and self.n_gen == 0:
            raise ValueError("n_prompt and n_gen are both 0: nothing would be measured")
        return self


class Sampler(_Strict):
    name: Literal["tpe", "random"] = "tpe"
    seed: int | None = 0


class Campaign(_Strict):
    """A validated campaign. `space` maps parameter names to a fixed value, a list (categorical) or a range."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    engine: str = "llama-bench"
    engine_options: dict[str, Any] = Field(default_factory=dict)
    model: list[str]
    space: dict[str, ParamSpec] = Field(default_factory=dict)
    objective: Union[Literal["tg", "pp"], dict[Literal["tg", "pp"], float]] = "tg"
    budget: Budget = Budget()
    constraints: Constraints = Constraints()
    measure: Measure = Measure()
    sampler: Sampler = Sampler()
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
            if not value or any(w < 0 for w in value.values()) or sum(value.values()) <= 0:
                raise ValueError("weights must be non-negative and not all zero, e.g. {tg: 0.7, pp: 0.3}")
        return value

    def objective_weights(self) -> dict[str, float]:
        """{'tg': 1.0} for a plain objective; normalised weights for a mix."""
        if isinstance(self.objective, str):
            return {self.objective: 1.0}
        total = sum(self.objective.values())
        return {k: v / total for k, v in self.objective.items() if v > 0}

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
        return cls.model_validate(json.loads(text))


_VALUE_CHECKS: dict[str, tuple[str, ...]] = {
    "type_k": KV_TYPES,
    "type_v": KV_TYPES,
    "flash_attn": FLASH_ATTN,
    "load_mode": LOAD_MODES,
}


def _values(spec: ParamSpec) -> list[Any]:
    if isinstance(spec, list):
        return spec
    if isinstance(spec, (IntRange, FloatRange)):
        return [spec.low, spec.high]
    return [spec]


def check_space(campaign: Campaign, supported: frozenset[str]) -> None:
    """Every parameter must be one the engine understands and every value one it accepts."""
    for name, spec in campaign.space.items():
        where = f"space.{name}"
        if name == "model":
            raise UserError(f"{where}: list model files under the top-level key 'model', not in space")
        if name not in supported:
            raise UserError(
                f"{where}: engine {campaign.engine!r} has no parameter {name!r}; "
                f"it supports: {', '.join(sorted(supported - {'model'}))}"
            )
        if isinstance(spec, list) and not spec:
            raise UserError(f"{where}: empty list; give at least one value")
        allowed = _VALUE_CHECKS.get(name)
        if allowed:
            bad = [v for v in _values(spec) if str(v) not in allowed]
            if bad:
                raise UserError(f"{where}: {bad[0]!r} is not one of {', '.join(allowed)}")
        if name in TrialConfig.field_names() - {"model", "override_tensors"} and name not in _VALUE_CHECKS:
            for v in _values(spec):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise UserError(f"{where}: {v!r} is not a number")
                if v < 0:
                    raise UserError(f"{where}: {v!r} is negative")


def _pydantic_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "union[", "list[")))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key; check the spelling against experiments/cpu-smoke.yaml"
    elif err["type"] == "missing":
        msg = "required key is missing"
    return f"{loc or 'campaign'}: {msg}"


def parse_campaign(data: Any, source: str = "<campaign>") -> Campaign:
    """Validate a loaded YAML document; raise UserError naming the bad key."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a campaign file must be a YAML mapping (name:, model:, space:, …)")
    try:
        return Campaign.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise UserError(f"{source}: {_pydantic_message(exc)}") from None


def load_campaign(path: Path) -> Campaign:
    """Read and validate a campaign file. Relative model paths are taken relative to the file."""
    if not path.is_file():
        raise UserError(f"campaign file {path} does not exist; see experiments/ for examples")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    campaign = parse_campaign(data, str(path))
    models = [m if m.startswith(SYNTH_PREFIX) or Path(m).is_absolute() else str((path.parent / m).resolve())
              for m in campaign.model]
    return campaign.model_copy(update={"model": models})
