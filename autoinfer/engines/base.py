"""The engine plugin contract: a TrialConfig goes in, a Measurement comes out.

The campaign loop knows nothing engine-specific; every engine turns the same TrialConfig into its own
invocation and reports the same Measurement, so llama-bench, llama-server, llama-cpp-python, the replay table
and the reference engine are interchangeable in a sweep.
"""

from __future__ import annotations

import inspect
import math
import statistics
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

from autoinfer.engines.knobs import Knob
from autoinfer.errors import UserError
from autoinfer.model.shape import ModelShape, shape_from_gguf
from autoinfer.trial_config import TrialConfig


class Outcome(str, Enum):
    """Why a trial ended the way it did. Only OK trials carry a score."""

    OK = "ok"
    OOM = "oom"  # out of memory on the device or host
    INFEASIBLE = "infeasible"  # over a budget or constraint of the campaign (memory, max_kld)
    PREDICTED_INFEASIBLE = "predicted_infeasible"  # never run: the memory model says it cannot fit
    LOAD_FAILED = "load_failed"  # the engine could not load the model (corrupt file, unsupported type)
    REJECTED = "rejected"  # the engine refused the configuration (bad flag combination)
    CRASH = "crash"  # killed by a signal or a non-zero exit we cannot explain further
    TIMEOUT = "timeout"  # ran past the trial timeout; the process group was killed
    BAD_OUTPUT = "bad_output"  # exited 0 but printed nothing we can parse
    PRUNED = "pruned"  # cut short because its first repetition was hopeless
    PREDICTED_SLOWER = "predicted_slower"  # never run: more whole layers in RAM than the best, predicted to lose

    @property
    def is_memory(self) -> bool:
        """Outcomes recorded as infeasible through Optuna's constraint mechanism."""
        return self in (Outcome.OOM, Outcome.INFEASIBLE, Outcome.PREDICTED_INFEASIBLE)


@dataclass(frozen=True)
class Decision:
    """A setting an engine imposes on every trial, and why: e.g. repack 0 because its build's smoke run crashed with
    weight repacking on. The loop prints it, records it on the study and puts it in every trial's configuration."""

    knob: str
    value: Any
    reason: str


def impose(config: TrialConfig, decisions: tuple[Decision, ...]) -> TrialConfig:
    """`config` with the imposed settings in place (a campaign that sets one otherwise is refused up front)."""
    if not decisions:
        return config
    return config.with_(extra=tuple({**dict(config.extra), **{d.knob: d.value for d in decisions}}.items()))


def median(samples: tuple[float, ...] | list[float]) -> float | None:
    return statistics.median(samples) if samples else None


@dataclass(frozen=True)
class Measurement:
    """What one trial measured. Raw per-repetition samples are kept; summaries are computed from them."""

    outcome: Outcome
    reason: str = ""
    tg_samples: tuple[float, ...] = ()  # generation tok/s, one per repetition
    pp_samples: tuple[float, ...] = ()  # prompt tok/s, one per repetition
    vram_peak_mib: float | None = None  # the largest per-GPU peak (a memory budget is per GPU)
    vram_per_gpu_mib: tuple[float, ...] = ()  # peak on each measured GPU, when the trial sampled several
    rss_peak_mib: float | None = None
    engine_cmd: tuple[str, ...] = ()
    wall_s: float = 0.0  # harness wall time for the trial
    engine_s: float | None = None  # the engine's own measured work (sum of its timed runs)
    stdout: str = ""
    stderr: str = ""
    raw_output: str = ""  # the engine's machine-readable output, verbatim
    metrics: dict[str, Any] = field(default_factory=dict)  # engine-specific: ttft_ms, load_s, cache hit rate …
    #: the numbers are another configuration's: a replay table's nearest row, where the table lacks this one. They
    #: stand in for the objective; the models of memory and speed do not learn from them.
    stand_in: bool = False
    env: dict[str, Any] = field(default_factory=dict)  # environment seen by the trial

    @property
    def tg(self) -> float | None:
        return median(self.tg_samples)

    @property
    def pp(self) -> float | None:
        return median(self.pp_samples)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def __post_init__(self) -> None:
        for name in ("tg_samples", "pp_samples"):
            values = tuple(float(v) for v in getattr(self, name))
            if any(not math.isfinite(v) or v < 0 for v in values):
                raise ValueError(f"{name} must be finite non-negative tok/s, got {values}")
            object.__setattr__(self, name, values)


@dataclass(frozen=True)
class Baseline:
    """The engine's own placement for a memory budget (llama.cpp: what llama-fit-params answers), measured as a
    labelled trial so the search has to beat it. `tensor_split` is in llama-bench's "a/b" notation."""

    n_gpu_layers: int
    override_tensors: tuple[str, ...]
    tensor_split: str | None
    how: str  # how the answer was obtained (the command), for the study's notes


@dataclass(frozen=True)
class RunContext:
    """What the loop gives an engine for one trial."""

    timeout_s: float
    artifacts: Path  # results/<study>/trials/<number>/: engines may write extra files here
    gpus: tuple[int, ...] = ()  # NVML indices of the devices whose memory is sampled; empty on CPU-only machines
    on_first_sample: Callable[[float], bool] | None = None  # returns True to cut a hopeless trial short


AS_RUN_KEYS = ("batch", "ubatch", "huge_pages")
"""The knobs an engine's as_run may change: where it does, the trial's record shows the value that ran."""


class Engine(ABC):
    """An engine plugin: implementations live in autoinfer/engines/<name>.py, subclass this and register below.
    Every capability the loop and the search use is declared here with its default; an engine overrides what
    it has, so nothing outside engines/ has to probe an engine for what it can do."""

    name: str
    #: The TrialConfig fields and `extra` knobs this engine understands, with the values each accepts; other
    #: parameters and values fail campaign validation (engines.knobs).
    knobs: Mapping[str, Knob]
    #: GPUs the measurements come from when that is not this machine's (a replay table measured on several).
    n_gpus: int | None = None
    #: The llama.cpp build the engine runs (for tools the loop runs beside it, e.g. the quality check); None if none.
    tools: Any = None

    def check(self) -> None:
        """Raise UserError when the engine cannot run here (binary missing, package not installed)."""

    @abstractmethod
    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        """Measure one configuration. Never raises for a failed trial: failures are Measurements."""

    def decisions(self) -> tuple[Decision, ...]:
        """Settings this engine must impose on every trial here (after check()); usually none."""
        return ()

    def refusal(self, config: TrialConfig) -> str | None:
        """Why the engine would refuse this configuration, known without running it; None when it would run."""
        return None

    def batch_context(self, config: TrialConfig) -> int | None:
        """The largest context (tokens) the engine creates for this configuration, where llama.cpp caps its batches;
        None where its batches are not capped by a context it creates (a replay table's rows are as measured)."""
        return None

    def as_run(self, config: TrialConfig) -> TrialConfig:
        """`config` with batch and ubatch as llama.cpp runs them: a causal model's batch is capped at the context and
        the ubatch at the batch (llama_context's constructor), so a larger value names the same run. It is measured
        once, predicted and exported as what ran: llama-bench's 512-token prompt ran ubatch 2048 at the peaks of 512
        on an H100 (benchmarks/tables/h100-35b-knobs.csv), and llama-server, whose context is larger, would run it
        larger than measured."""
        context = self.batch_context(config)
        if context is None:
            return config
        batch = min(config.batch, context)
        return config.with_(batch=batch, ubatch=min(config.ubatch, batch))

    def resolve_models(self, entries: list[str]) -> dict[str, str]:
        """The campaign's model entries as the files (or labels) the engine runs."""
        from autoinfer.model.resolve import resolve_models

        return resolve_models(entries)

    def baseline(self, model: Path, budget_mib: float, n_ctx: int, batch: int, ubatch: int) -> Baseline | str:
        """The engine's own placement that fits `budget_mib` of memory per GPU for this context and batch sizes, or
        why it has none."""
        return f"no baseline for a memory budget from engine {self.name!r}"

    def preferred_values(self, device_budget: bool) -> dict[str, Any]:
        """Values of its knobs the engine knows to be better than its defaults, for a search's first trials (with a
        device memory budget, or without one)."""
        return {}

    def model_shape(self, model: str) -> ModelShape | None:
        """The architecture and tensor bytes of a resolved model, for the memory and performance models."""
        return shape_from_gguf(Path(model))


_FACTORIES: dict[str, Callable[..., Engine]] = {}


def register(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    def deco(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        _FACTORIES[name] = factory
        return factory

    return deco


ENGINE_MODULES = {
    "llama-bench": "autoinfer.engines.llama_bench",
    "llama-server": "autoinfer.engines.llama_server",
    "llama-cpp-python": "autoinfer.engines.llama_cpp_python",
    "replay": "autoinfer.engines.replay",
    "reference": "autoinfer.engines.reference",
}


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared here so that no code outside engines/ compares engine names."""

    llama_settings: bool = False  # its configurations are llama.cpp settings: export writes llama.cpp commands
    python_settings: bool = False  # it measured through Llama(...) itself: its settings are that API's, as measured
    runs_llama_tools: bool = False  # runs llama.cpp's tools on this worker's GPUs (multi-GPU knobs, fit baseline)
    host_measurement: bool = True  # runs something on this host, so trials of one host take turns (host lock)
    own_command: bool = False  # not llama.cpp: the command a trial ran (engine_cmd) is how to run its configuration
    generates: bool = False  # has a command that generates text with a configuration (export --format generate)


CAPABILITIES = {
    "llama-bench": Capabilities(llama_settings=True, runs_llama_tools=True),
    "llama-server": Capabilities(llama_settings=True, runs_llama_tools=True),
    "llama-cpp-python": Capabilities(llama_settings=True, python_settings=True),
    "replay": Capabilities(llama_settings=True, host_measurement=False),  # a table of llama.cpp measurements
    "reference": Capabilities(own_command=True, generates=True),
}


def capabilities(name: str) -> Capabilities:
    """The capabilities of an engine by its campaign-file name."""
    if name not in CAPABILITIES:
        raise UserError(f"unknown engine {name!r}: use one of {', '.join(CAPABILITIES)}")
    return CAPABILITIES[name]


def knobs_of(name: str) -> Mapping[str, Knob] | None:
    """The knobs of an engine by name, without creating it; None when they depend on its options (a replay table's
    columns) or its module cannot be imported here."""
    try:
        factory = _factory(name)
    except UserError:
        return None
    knobs = getattr(factory, "knobs", None)
    return knobs if isinstance(knobs, Mapping) else None


def _factory(name: str) -> Callable[..., Engine]:
    if name not in ENGINE_MODULES:
        raise UserError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_MODULES)}")
    if name not in _FACTORIES:
        import importlib

        try:
            importlib.import_module(ENGINE_MODULES[name])
        except ModuleNotFoundError as exc:
            raise UserError(f"engine {name!r} is not available: {exc}; install its extra") from exc
    return _FACTORIES[name]


def create(name: str, **options: Any) -> Engine:
    """Instantiate an engine by its campaign-file name."""
    factory = _factory(name)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError:
        params = [p for p in inspect.signature(factory).parameters.values() if p.kind is p.KEYWORD_ONLY
                  or p.kind is p.POSITIONAL_OR_KEYWORD]
        unknown = sorted(set(options) - {p.name for p in params})
        raise UserError(f"engine_options.{unknown[0] if unknown else ''}: engine {name!r} takes "
                        f"{', '.join(p.name for p in params) or 'no options'}") from None
    try:
        return factory(**options)
    except (TypeError, ValueError) as exc:  # an option of the wrong kind, e.g. a number where a path belongs
        raise UserError(f"engine_options of engine {name!r}: {str(exc).splitlines()[0]}; check each option's "
                        "value against the README") from None
