"""A study as a table, and outside rows as a study.

`study_frame` turns every trial into one DataFrame row: what its TrialRecord carries (state, outcome, every stored
scalar by its stored name, the host), its configuration, medians with bootstrap CIs and the environment;
`add_to_study` stores imported rows as TrialRecords (one trial per row, the full configuration in `config`), so
status/analyze/export treat them like measured trials.
Re-importing a file skips rows already in the study (same source file and line).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autoinfer.analysis.importers import ImportedRow, ImportResult
from autoinfer.engines.base import Outcome, TrialConfig
from autoinfer.errors import UserError
from autoinfer.measure.stats import summarize
from autoinfer.model.placement import PLACEMENT_KEYS, cpu_layers, placement_bytes, realize
from autoinfer.store.records import ImportJunk, TrialRecord
from autoinfer.store.trials import Store, flagged_trials


@dataclass(frozen=True)
class ImportSummary:
    study: str
    added: int
    skipped_duplicates: int
    junk: int


def _config(row: ImportedRow) -> dict[str, Any]:
    params = dict(row.params)
    params.setdefault("model", Path(row.source_file).stem)
    return TrialConfig.from_params(params).to_params()


def _searched(configs: Sequence[dict[str, Any]]) -> dict[str, BaseDistribution]:
    """Distributions for the parameters whose values differ between rows (the ones an analysis can explain)."""
    names = sorted({k for c in configs for k in c} - {"model", "override_tensors", "variant", "repetitions"})
    out: dict[str, BaseDistribution] = {}
    for name in names:
        values = [c[name] for c in configs if c.get(name) is not None]
        if len({repr(v) for v in values}) < 2:
            continue
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[name] = IntDistribution(min(values), max(values))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[name] = FloatDistribution(float(min(values)), float(max(values)))
        else:
            out[name] = CategoricalDistribution(sorted({str(v) for v in values}))
    models = {c["model"] for c in configs}
    if len(models) > 1 and not any(_determines(configs, name) for name in out):
        out["model"] = CategoricalDistribution(sorted(models))
    return out


def _determines(configs: Sequence[dict[str, Any]], name: str) -> bool:
    """True when the parameter and the model name change together (the seed's quant): one of them is enough."""
    pairs = {(str(c.get(name)), c["model"]) for c in configs}
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def _merge(existing: dict[str, BaseDistribution], new: dict[str, BaseDistribution],
           study: str) -> dict[str, BaseDistribution]:
    """Widen numeric ranges; categorical choices must match those already in the study (Optuna's rule)."""
    merged = dict(new)
    for name, dist in new.items():
        old = existing.get(name)
        if old is None:
            continue
        if type(old) is not type(dist):
            raise UserError(f"parameter {name!r} is {type(old).__name__} in study {study!r} but "
                            f"{type(dist).__name__} in the imported rows; import into a new --study")
        if isinstance(dist, CategoricalDistribution):
            if set(dist.choices) - set(old.choices):
                raise UserError(f"parameter {name!r} has new values {sorted(set(dist.choices) - set(old.choices))} "
                                f"not in study {study!r}; import into a new --study")
            merged[name] = old
        else:
            merged[name] = type(dist)(min(old.low, dist.low), max(old.high, dist.high))
    return merged


def _trial(row: ImportedRow, config: dict[str, Any], dists: dict[str, BaseDistribution]) -> TrialRecord:
    """The record of one imported row (its number is given when the store adds it)."""
    params = {}
    for name, dist in dists.items():
        value = config.get(name)
        if value is None:
            continue
        params[name] = str(value) if isinstance(dist, CategoricalDistribution) else value
    used = {k: v for k, v in dists.items() if k in params}
    samples = row.tg_samples or row.pp_samples
    if row.outcome.is_memory:
        state, values, constraints = TrialState.PRUNED, None, {"memory": 1.0}
    elif row.outcome is Outcome.OK and samples:
        state, values, constraints = TrialState.COMPLETE, (statistics.median(samples),), {}
    else:
        state, values, constraints = TrialState.FAIL, None, {}
    return TrialRecord(
        0, state, params, values, constraints, used, config=config, outcome=row.outcome.value, reason=row.reason,
        tg_samples=tuple(row.tg_samples), pp_samples=tuple(row.pp_samples), vram_peak_mib=row.vram_peak_mib,
        rss_peak_mib=row.rss_peak_mib, wall_s=0.0, env=dict(row.env), source_file=row.source_file,
        source_line=row.source_line, label=row.label)


def add_to_study(results: Sequence[ImportResult], study: optuna.Study) -> ImportSummary:
    """Add every row of the read files to the study; rows of earlier imports (same file and line) are skipped."""
    study_name = study.study_name
    study_store = Store(study)
    existing_trials = study_store.records()
    seen = {(t.source_file, t.source_line) for t in existing_trials}
    rows = [r for res in results for r in res.rows if (r.source_file, r.source_line) not in seen]
    skipped = sum(len(res.rows) for res in results) - len(rows)
    configs = [_config(r) for r in rows]
    existing: dict[str, BaseDistribution] = {}
    for t in existing_trials:
        existing.update(t.distributions)
    dists = _merge(existing, _searched(configs), study_name)
    study_store.add_trials([_trial(r, c, dists) for r, c in zip(rows, configs)])
    kept = study_store.study_record()
    files = [*kept.imported_files, *(res.path for res in results if res.path not in kept.imported_files)]
    known = {(j.file, j.line) for j in kept.import_junk}
    junk = [*kept.import_junk, *(ImportJunk(j.source_file, j.source_line, j.reason)
                                 for res in results for j in res.junk if (j.source_file, j.source_line) not in known)]
    study_store.write_study(imported_files=tuple(files), import_junk=tuple(junk))
    return ImportSummary(study_name, len(rows), skipped, sum(len(res.junk) for res in results))


# ---------------------------------------------------------------- study → DataFrame

# Configuration keys that do not change what is measured; replicates differ only in these.
_NOT_IDENTITY = {"repetitions", "label"}


def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """Bootstrap CI of the median (autoinfer.measure.stats); (nan, nan) with fewer than 2 samples."""
    summary = summarize(samples)
    if summary.ci_low is None or summary.ci_high is None:
        return (float("nan"), float("nan"))
    return summary.ci_low, summary.ci_high


def config_key(config: dict[str, Any]) -> str:
    """A short stable id of a configuration, equal for replicates of the same one."""
    identity = {k: v for k, v in sorted(config.items()) if k not in _NOT_IDENTITY}
    return hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _flat_env(env: dict[str, Any]) -> dict[str, Any]:
    return {f"env_{k}": v for k, v in env.items() if isinstance(v, (str, int, float, bool)) or v is None}


def _summary(samples: list[float], kind: str) -> dict[str, Any]:
    low, high = median_ci(samples)
    return {f"{kind}_median": statistics.median(samples) if samples else float("nan"),
            f"{kind}_ci_low": low, f"{kind}_ci_high": high, f"{kind}_n": len(samples),
            f"{kind}_samples": list(samples)}


def trial_row(t: TrialRecord) -> dict[str, Any]:
    """The record's own columns (TrialRecord.columns: every stored scalar, the host) after the trial's state and
    outcome, then its configuration's parameters, the samples' medians with CIs and the environment (env_*)."""
    config = dict(t.config or {})
    if isinstance(config.get("override_tensors"), list):
        config["override_tensors"] = ";".join(config["override_tensors"])
    value = t.value if t.state == TrialState.COMPLETE else None
    row: dict[str, Any] = {
        "trial": t.number,
        "state": t.state.name.lower(),
        "outcome": t.status,
        "feasible": all(v <= 0 for v in t.constraints.values()),
        "value": value if value is not None else float("nan"),
        "config_key": config_key(config) if config else "",
        **t.columns(),
    }
    row.update({k: v for k, v in config.items() if k not in row})
    row.update({**_summary(t.samples("tg"), "tg"), **_summary(t.samples("pp"), "pp"), **_flat_env(t.env)})
    return row


def study_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per finished trial, in trial order. Queued and running trials have measured nothing yet, and stale
    (re-queued) trials are left out: their retry is the measurement."""
    trials = [t for t in Store(study).records() if t.state.is_finished() and not t.stale]
    frame = pd.DataFrame([trial_row(t) for t in trials])
    if frame.empty:
        raise UserError(f"study {study.study_name!r} has no trials; run `autoinfer sweep` or `autoinfer import`")
    frame["drift_flagged"] = frame["trial"].isin(flagged_trials(study))
    return frame


def add_placement_features(frame: pd.DataFrame, info_of: Callable[[str], Any | None]) -> pd.DataFrame:
    """GB of weights on the GPU and in RAM (total and read per token) and the whole layers left on the CPU, from
    each model's GGUF byte accounting of the trial's placement (its -ngl, -ncmoe and overrides, and the campaign's
    placement parameters `placement`/`cpu_expert_layers`/`partial_experts`/`expert_split` realised as llama.cpp
    would get them).

    `info_of(model)` returns the model's byte accounting (model_info_of), or None when it is not on this machine
    (imported rows); those rows get NaN rather than a guess.
    """
    out = frame.copy()
    columns = ("gpu_gb", "cpu_gb", "active_gpu_gb", "active_cpu_gb", "cpu_layers")
    values: dict[str, list[float]] = {c: [] for c in columns}
    infos: dict[str, Any] = {}
    for _, r in out.iterrows():
        model = str(r.get("model", ""))
        if model not in infos:
            infos[model] = info_of(model)
        info = infos[model]
        if info is None:
            for c in columns:
                values[c].append(float("nan"))
            continue
        gpu = ran_on_gpu(r)
        config = realize(placement_config(r), info.n_layers)
        pb = placement_bytes(info, config.n_gpu_layers, config.n_cpu_moe, config.override_tensors, gpu=gpu)
        for c in columns[:-1]:
            values[c].append(getattr(pb, c))
        values["cpu_layers"].append(cpu_layers(config.n_gpu_layers, info.n_layers, gpu))
    for c in columns:
        out[c] = values[c]
    return out


def placement_config(row: pd.Series) -> TrialConfig:
    """The placement part of a trial row as a configuration (missing values take llama.cpp's defaults)."""
    given = {k: row.get(k) for k in ("n_gpu_layers", "n_cpu_moe", "override_tensors", *PLACEMENT_KEYS)}
    given = {k: v for k, v in given.items() if v is not None and not (isinstance(v, float) and math.isnan(v))
             and v != ""}
    for k in ("n_gpu_layers", "n_cpu_moe", "cpu_expert_layers", "partial_experts"):
        if k in given:
            given[k] = int(given[k])
    return TrialConfig.from_params({"model": str(row.get("model", "")), **given})


def ran_on_gpu(row: pd.Series) -> bool:
    """Whether the trial's llama.cpp build had a GPU backend (a CPU build keeps every weight in RAM whatever -ngl
    says). Read from the trial's environment: the build flag, else llama-bench's `backends`; rows that carry
    neither (the seed's imports) ran on a GPU by their provenance."""
    cuda = row.get("env_tools_cuda")
    if isinstance(cuda, (bool, np.bool_)):
        return bool(cuda)
    backends = row.get("env_backends")
    if isinstance(backends, str) and backends:
        return any(b.strip().upper() != "CPU" for b in backends.split(","))
    return True


def model_info_of(model: str) -> Any | None:
    """The byte accounting of a trial's model: a GGUF that exists here (ModelInfo), or the shape JSON a table
    carries instead of its GGUF (ModelShape: tensors and layer counts, all the placement needs). None for a model
    name without a file (imported rows), a file that is neither (a replay campaign's label) or a GGUF autoinfer
    cannot size (another architecture, a damaged file: its trials failed to load, and the analysis of the rest goes
    on)."""
    path = Path(model)
    if not path.is_file():
        return None
    if path.name.endswith(".shape.json"):
        from autoinfer.model.shape import ModelShape

        try:
            return ModelShape.from_json(path.read_text())
        except (ValueError, TypeError, KeyError):
            return None
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            return None
    from autoinfer.model.gguf_info import read_info

    try:
        return read_info(path)
    except UserError:
        return None


def load_frame(study: optuna.Study, *, placement: bool = True) -> pd.DataFrame:
    """The analysis table of a study, with the GGUF-derived placement columns."""
    frame = study_frame(study)
    return add_placement_features(frame, model_info_of) if placement else frame


# ---------------------------------------------------------------- per configuration

# Columns that describe a configuration in the per-configuration table (those present are kept).
CONFIG_COLUMNS = ("model", "quant", "n_gpu_layers", "n_cpu_moe", "placement", "cpu_expert_layers", "partial_experts",
                  "expert_split", "override_tensors", "threads", "batch", "ubatch", "type_k", "type_v",
                  "flash_attn", "load_mode", "n_ctx", "n_gen", "variant")


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful, feasible trials with at least one generation sample that the drift anchor did not flag (measured
    while the machine had changed: the recommendation leaves them out too, and their re-measurements are in)."""
    ok = (frame["outcome"] == "ok") & frame["feasible"] & (frame["tg_n"] > 0)
    if "drift_flagged" in frame:
        ok &= ~frame["drift_flagged"].astype(bool)
    return frame[ok]


def config_table(frame: pd.DataFrame, kind: str = "tg") -> pd.DataFrame:
    """One row per configuration, its samples pooled over trials, sorted fastest first by median."""
    rows = []
    for key, group in ok_rows(frame).groupby("config_key", sort=False):
        samples = [v for lst in group[f"{kind}_samples"] for v in lst]
        if not samples:
            continue
        low, high = median_ci(samples)
        first = group.iloc[0]
        rows.append({
            "config_key": key,
            **{c: first[c] for c in CONFIG_COLUMNS if c in group.columns},
            "trials": len(group),
            "n": len(samples),
            "median": float(np.median(samples)),
            "ci_low": low,
            "ci_high": high,
            "mean": float(np.mean(samples)),
            "std": float(np.std(samples, ddof=1)) if len(samples) > 1 else math.nan,
            "min": float(np.min(samples)),
            "max": float(np.max(samples)),
            "vram_peak_mib": float(group["vram_peak_mib"].max()) if group["vram_peak_mib"].notna().any() else math.nan,
            "first_trial": int(group["trial"].min()),
            "samples": samples,
        })
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    return table.sort_values("median", ascending=False, ignore_index=True)
