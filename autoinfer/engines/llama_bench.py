"""The llama-bench engine: one llama-bench process per trial, its JSON read by field name.

One process per configuration on purpose: a failed model load or context makes llama-bench exit and drop the
rest of its list, and a fresh process gives every trial the same cold start. llama-bench reports only when each
test has finished, so this engine leaves RunContext.on_first_sample unused; engines that see repetitions as they
happen (llama-server) use it to cut hopeless trials short.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from autoinfer.engines.base import Measurement, Outcome, RunContext, TrialConfig, register
from autoinfer.engines.knobs import BENCH_KNOBS, MULTI_GPU_KNOBS, TRIAL_KNOBS
from autoinfer.engines.llama_common import (
    LlamaToolsEngine,
    bench_args,
    child_environment,
    classify_failure,
    huge_pages_metrics,
)
from autoinfer.measure.process import run_isolated
from autoinfer.trial_config import wants_huge_pages

#: Fields of a llama-bench record that describe the build and machine rather than the configuration.
ENV_FIELDS = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends")


def parse_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects llama-bench printed: a JSON array (-o json), JSON lines (-o jsonl), or the complete
    records of an array cut short by a crash."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        return [data]
    decoder = json.JSONDecoder()
    records: list[dict[str, Any]] = []
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            records.append(obj)
        pos = text.find("{", end)
    return records


def kind_of(record: dict[str, Any]) -> str | None:
    """"pp" or "tg": which rate a record measured."""
    n_prompt, n_gen = int(record.get("n_prompt", 0)), int(record.get("n_gen", 0))
    if n_prompt > 0 and n_gen == 0:
        return "pp"
    if n_gen > 0 and n_prompt == 0:
        return "tg"
    return None  # a combined -pg test: neither a prompt nor a generation rate


def load_mode_of(record: dict[str, Any]) -> str | None:
    """load_mode in current builds; use_mmap (bool) before it existed."""
    if "load_mode" in record:
        return str(record["load_mode"])
    if "use_mmap" in record:
        return "mmap" if record["use_mmap"] in (True, 1, "1", "true") else "none"
    return None


def samples_of(record: dict[str, Any]) -> tuple[tuple[float, ...], bool]:
    """Per-repetition tok/s and whether they are real samples (samples_ts) or one average (older builds)."""
    if isinstance(record.get("samples_ts"), list) and record["samples_ts"]:
        return tuple(float(v) for v in record["samples_ts"]), True
    if "avg_ts" in record:
        return (float(record["avg_ts"]),), False
    return (), False


def measurement_from_json(text: str, config: TrialConfig) -> Measurement:
    """Samples, engine time and environment from llama-bench JSON output (exit status 0 assumed); a malformed
    record (a null count, a negative or infinite sample, nesting deeper than the JSON parser goes) is bad_output."""
    try:
        m = _measurement(text, config)
    except (TypeError, ValueError, OverflowError, KeyError, RecursionError) as exc:
        return Measurement(Outcome.BAD_OUTPUT, reason=f"llama-bench printed a malformed record ({exc})"[:500],
                           raw_output=text)
    bad = [v for v in (*m.tg_samples, *m.pp_samples) if not math.isfinite(v) or v <= 0]
    if bad:
        return Measurement(Outcome.BAD_OUTPUT, reason=f"llama-bench reported an impossible rate {bad[0]!r} tok/s",
                           raw_output=text)
    return m


def _measurement(text: str, config: TrialConfig) -> Measurement:
    records = parse_records(text)
    by_kind = {k: r for r in records if (k := kind_of(r))}
    wanted = [k for k, n in (("pp", config.n_prompt), ("tg", config.n_gen)) if n > 0]
    missing = [k for k in wanted if k not in by_kind]
    if not records or missing:
        what = "no JSON records" if not records else f"no {' and '.join(missing)} record"
        return Measurement(Outcome.BAD_OUTPUT, reason=f"llama-bench exited 0 but printed {what}", raw_output=text)
    samples: dict[str, tuple[float, ...]] = {"pp": (), "tg": ()}
    metrics: dict[str, Any] = {}
    engine_s = 0.0
    for kind in wanted:
        rec = by_kind[kind]
        samples[kind], real = samples_of(rec)
        if not real:
            metrics[f"{kind}_samples_source"] = "avg_ts (this llama-bench build reports no samples_ts)"
        engine_s += sum(float(ns) for ns in rec.get("samples_ns") or []) / 1e9
        metrics[f"{kind}_tokens"] = int(rec["n_prompt"] if kind == "pp" else rec["n_gen"])
    first = by_kind[wanted[0]]
    for key in ("model_size", "model_n_params", "model_type", "n_threads", "n_gpu_layers", "n_cpu_moe"):
        if key in first:
            metrics[key] = first[key]
    if (mode := load_mode_of(first)) is not None:
        metrics["load_mode"] = mode
    env = {k: first[k] for k in ENV_FIELDS if k in first}
    return Measurement(Outcome.OK, tg_samples=samples["tg"], pp_samples=samples["pp"],
                       engine_s=engine_s or None, raw_output=text, metrics=metrics, env=env)


@register("llama-bench")
class LlamaBenchEngine(LlamaToolsEngine):
    """Measures a configuration with llama-bench (-o json -v), in an isolated child."""

    name = "llama-bench"
    binary = "llama-bench"
    knobs = {**TRIAL_KNOBS, **BENCH_KNOBS, **MULTI_GPU_KNOBS}

    def command(self, config: TrialConfig) -> list[str]:
        """The argv of one trial: -v so llama.cpp's own error lines reach stderr (see llama_common)."""
        binary = self.tools.tool("llama-bench")
        verbose = ["-v"] if "-v" in self.tools.help_flags("llama-bench") else []
        return [str(binary), *verbose, *bench_args(config, self.tools)]

    def batch_context(self, config: TrialConfig) -> int | None:
        """Each test has its own context: the prompt's for pp, the generation's for tg."""
        return max(config.n_prompt, config.n_gen)

    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        argv = self.command(config)
        res = run_isolated(argv, timeout_s=ctx.timeout_s, env=child_environment(config, self.tools), gpus=ctx.gpus,
                           huge_pages=wants_huge_pages(config))
        common: dict[str, Any] = dict(
            engine_cmd=tuple(argv), wall_s=res.wall_s, stdout=res.stdout, stderr=res.stderr,
            vram_peak_mib=res.vram_peak_mib, vram_per_gpu_mib=res.vram_per_gpu_mib, rss_peak_mib=res.rss_peak_mib,
        )
        run_env = {**self.run_env(config), "vram_method": res.vram_method}
        if res.returncode != 0 or res.timed_out:
            outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr,
                                               rss_peak_mib=res.rss_peak_mib, crash=res.crash)
            return Measurement(outcome, reason=reason, raw_output=res.stdout, env=run_env,
                               metrics=res.crash.as_metrics() if res.crash else {}, **common)
        m = measurement_from_json(res.stdout, config)
        metrics = {**m.metrics, **huge_pages_metrics(config, res.huge_pages_peak_mib)}
        return replace(m, env={**run_env, **m.env}, metrics=metrics, **common)
