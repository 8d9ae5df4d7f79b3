"""The `reference` engine: autoinfer's own PyTorch implementation (autoinfer.refengine), measured like llama-bench.

Each trial runs `python -m autoinfer.refengine.worker` in an isolated child and reads the one JSON line it prints.
Its knobs (campaign `space:` names beyond the TrialConfig fields) are the fields of refengine/options.py's
EngineOptions, declared there once: device, dtype, weights (dense | gguf), gdn, moe, prefill_chunk, torch_threads,
expert_slots (0 = all experts on the device) or budget_mib (the expert cache sized to a device budget),
cache_policy, prefetch (layers ahead), misses (copy | cpu), snapshots, graphs (on | off), max_context.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from autoinfer.engines.base import Engine, Measurement, Outcome, RunContext, TrialConfig, register
from autoinfer.engines.knobs import TRIAL_KNOBS, Knob
from autoinfer.engines.llama_common import classify_failure
from autoinfer.errors import UserError
from autoinfer.measure.process import run_isolated
from autoinfer.refengine.options import KNOBS, EngineOptions

_EXIT_OUTCOMES = {2: Outcome.REJECTED, 3: Outcome.LOAD_FAILED, 4: Outcome.OOM}


def worker_command(config: TrialConfig) -> list[str]:
    argv = [sys.executable, "-m", "autoinfer.refengine.worker", "--model", str(config.model),
            "--n-prompt", str(config.n_prompt), "--n-gen", str(config.n_gen),
            "--repetitions", str(config.repetitions)]
    return argv + options_of(config).to_argv()


def generate_command(config: TrialConfig, prompt: str = "Hello") -> list[str]:
    """Text generated with `config` (refengine/generate.py): the worker's engine flags, a prompt instead of a
    measurement; as it is printed for a user to paste, and run by the deployment check."""
    return [sys.executable, "-m", "autoinfer.refengine.generate", "--model", str(config.model),
            *options_of(config).to_argv(), "--prompt", prompt]


def options_of(config: TrialConfig) -> EngineOptions:
    """The engine knobs a trial sets (UserError for a value of the wrong kind)."""
    return EngineOptions.from_knobs({name: config.get(name) for name in KNOBS if config.get(name) is not None})


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    return lines[-1][len("error:"):].strip() if lines else ""


def _knob(name: str) -> Knob:
    """A value the EngineOptions field takes, converted as the worker converts it."""
    def check(value: Any) -> str | None:
        try:
            EngineOptions.from_knobs({name: value})
        except UserError as exc:
            return str(exc)
        return None
    return Knob(check)


@register("reference")
class ReferenceEngineRunner(Engine):
    name = "reference"
    knobs = {**{name: TRIAL_KNOBS[name] for name in ("model", "n_prompt", "n_gen", "repetitions")},
             **{name: _knob(name) for name in KNOBS}}

    def check(self) -> None:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise UserError("engine 'reference' needs PyTorch: pip install 'autoinfer[engine]'")

    def refusal(self, config: TrialConfig) -> str | None:
        """Why the engine would refuse these knobs (graphs on a CPU, a fused MoE on dense weights ...), known before
        any process starts."""
        try:
            options_of(config).check()
        except UserError as exc:
            return str(exc)
        return None

    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        argv = worker_command(config)
        res = run_isolated(argv, timeout_s=ctx.timeout_s, gpus=ctx.gpus)
        common: dict[str, Any] = dict(engine_cmd=tuple(argv), wall_s=res.wall_s, stdout=res.stdout,
                                      stderr=res.stderr, vram_peak_mib=res.vram_peak_mib,
                                      vram_per_gpu_mib=res.vram_per_gpu_mib, rss_peak_mib=res.rss_peak_mib,
                                      raw_output=res.stdout)
        if res.timed_out or res.returncode != 0:
            if not res.timed_out and res.returncode in _EXIT_OUTCOMES:
                return Measurement(_EXIT_OUTCOMES[res.returncode], reason=_error_line(res.stderr), **common)
            outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr,
                                               rss_peak_mib=res.rss_peak_mib, crash=res.crash)
            return Measurement(outcome, reason=reason, metrics=res.crash.as_metrics() if res.crash else {},
                               **common)
        data = _last_json(res.stdout)
        if data is None:
            return Measurement(Outcome.BAD_OUTPUT, reason="the worker exited 0 without a JSON line", **common)
        metrics = {k: v for k, v in data.items() if k not in ("pp_samples", "tg_samples", "engine_s")}
        env = {"torch": data.get("torch"), "device_name": data.get("device_name"),
               "vram_method": res.vram_method}
        return Measurement(Outcome.OK, tg_samples=tuple(data["tg_samples"]), pp_samples=tuple(data["pp_samples"]),
                           engine_s=data.get("engine_s"), metrics=metrics, env=env, **common)
