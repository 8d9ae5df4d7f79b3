"""llama-fit-params' answer for the campaign's memory budget, measured as labelled baseline trials: what a user gets
from llama.cpp's own `--fit` for free, and so what the sweep's answer has to beat (the confirmation measures the two
side by side, sweep/confirm.py).

llama-fit-params estimates the peak itself and its estimate can miss: on an H100 with the 35B-A3B Q4_K stand-in its
answers peaked at 8302 MiB for an 8192 MiB budget and 12328 for 12288 (benchmarks/results/vs-fit-h100.md). An answer
over the budget is no baseline, so after a measured (or confidently predicted) overshoot it is asked again for that
much less plus FIT_SLACK_MIB, up to FIT_TRIES answers, as benchmarks/vs_fit.py does. What it asked for each time
follows from the trials, so a resumed sweep goes on where it stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from autoinfer.engines.knobs import llama_defaults
from autoinfer.model.placement import (
    FOLLOW_LAYERS,
    cpu_expert_layers,
    expert_override,
    layers_on_cpu,
    overridden,
    partial_layer,
    partial_override,
)
from autoinfer.model.shape import ModelShape
from autoinfer.search.context import SearchContext, allowed
from autoinfer.store.records import TrialRecord
from autoinfer.trial_config import TrialConfig

FIT_LABEL = "baseline: llama-fit-params"
FIT_TRIES = 3  # answers asked for at most: the first, and two after overshoots
FIT_SLACK_MIB = 64  # asked for this much less again than the overshoot (the peak moves by whole tensors)
OVER = ("infeasible", "oom", "predicted_infeasible")
WAITING = "waiting for its measurement"


def fit_label(ctx: SearchContext, budget_mib: float) -> str:
    """The label of a baseline trial asked for `budget_mib` (per GPU on several)."""
    return f"{FIT_LABEL} for {budget_mib:.0f} MiB" + (f" per GPU on {ctx.n_gpus} GPUs" if ctx.n_gpus > 1 else "")


def is_fit_trial(record: TrialRecord) -> bool:
    return (record.label or "").startswith(FIT_LABEL)


def fit_trials(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The baseline trials among a study's, in order."""
    return [t for t in records if is_fit_trial(t)]


def next_budget(ctx: SearchContext, earlier: Sequence[TrialRecord]) -> tuple[float | None, str]:
    """The budget to ask llama-fit-params for next, or None with the reason there is none: an answer fitted, one
    failed another way, one is not measured yet, or FIT_TRIES were asked for."""
    budget = ctx.budget_mib
    assert budget is not None
    asked = budget
    for t in earlier:
        if not t.state.is_finished():
            return None, WAITING
        peak = t.budget_peak("device") if t.outcome != "predicted_infeasible" else None
        if t.is_feasible_ok:
            return None, f"trial {t.number} measured its answer within the budget" + (
                f" ({peak:.0f} MiB)" if peak is not None else "")
        if t.outcome not in OVER and not (t.outcome in ("ok", "pruned") and peak is not None and peak > budget):
            return None, f"trial {t.number}, its answer, ended {t.status}"
        over = peak if peak is not None else t.predicted_mib
        if over is None or over <= budget:
            return None, f"trial {t.number} ended {t.status} with no peak over the budget to correct by"
        asked -= over - budget + FIT_SLACK_MIB
    if len(earlier) >= FIT_TRIES:
        return None, f"{FIT_TRIES} answers were over the budget"
    return asked, ""


def as_llama_runs_it(ctx: SearchContext, others: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`others` with each knob at llama.cpp's default where the campaign allows that value, as `llama-server --fit on`
    runs with nothing else set; and the knobs left at the search's values ("threads 12 (llama.cpp's default 16 is not
    among the campaign's values)"). With the search's starting values instead (-lm none, the middle thread count),
    fit's 8 GiB answer on an H100 ran 60 tok/s where llama.cpp's defaults ran it at 70: the baseline was not what
    a user gets from fit, and the sweep's ratio to it was flattered."""
    params, kept = dict(others), []
    for knob, default in llama_defaults().items():
        if knob not in others or others[knob] == default:
            continue
        if default in (allowed(ctx.campaign, knob) or []):
            params[knob] = default
        else:
            kept.append(f"{knob} {others[knob]} (llama.cpp's default {default} is not among the campaign's values)")
    return params, kept


def fit_params_trial(ctx: SearchContext, path: str, searched: dict[str, Any], others: dict[str, Any],
                     budget_mib: float) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """llama-fit-params' placement when asked for `budget_mib`: the trial's parameters (the placement as searched
    parameters where the space has it; the other knobs as llama.cpp runs them, else at `others`' values) and the
    record fields that carry its raw overrides and tensor split; or why there is none."""
    shape = ctx.shapes.get(path)
    if shape is None:
        return f"no model shape for {Path(path).name}: llama-fit-params' answer cannot be placed, no baseline"
    m = ctx.campaign.measure
    fixed = ctx.campaign.fixed()
    answer = ctx.engine.baseline(Path(path), budget_mib, max(m.n_prompt + m.n_gen, ctx.campaign.serve.context or 0),
                                 fixed.get("batch", 2048), fixed.get("ubatch", 512))
    if isinstance(answer, str):
        return answer
    ngl, patterns, split = answer.n_gpu_layers, answer.override_tensors, answer.tensor_split
    params, kept = as_llama_runs_it(ctx, others)
    ctx.notes.append(f"llama-fit-params for {budget_mib:.0f} MiB: {answer.how} → -ngl {ngl}, {len(patterns)} "
                     "override(s)" + (f", -ts {split}" if split else "") + "; the other knobs at llama.cpp's defaults"
                     + (f" except {', '.join(kept)}" if kept else ""))
    layers = layers_on_cpu(patterns, shape.tensor_names)
    fields: dict[str, Any] = {}
    if "n_gpu_layers" in searched:
        values = allowed(ctx.campaign, "n_gpu_layers") or []
        params["n_gpu_layers"] = next((v for v in values if min(v, shape.n_layers + 1) == min(ngl, shape.n_layers + 1)),
                                      max(values))
    runs = params.get("n_gpu_layers", fixed.get("n_gpu_layers", TrialConfig.n_gpu_layers))
    if min(runs, shape.n_layers + 1) != min(ngl, shape.n_layers + 1):
        return (f"llama-fit-params answered -ngl {ngl} for {budget_mib:.0f} MiB, which the campaign's n_gpu_layers "
                "cannot express: no baseline trial (put that value in the space)")
    # "last N", with part of one more layer where the campaign has partial_experts (llama-fit-params fills the GPU
    # tensor by tensor: its 12288 MiB answer on an H100 left one layer's down projection in RAM beside 17 whole
    # layers), where that moves the same tensors to the same place; any other answer (a per-GPU override, a part
    # the campaign cannot say) runs as its raw overrides
    parts = _as_last(patterns, len(layers), runs, ctx, shape)
    if parts is not None:
        params.update({k: v for k, v in (("placement", "last"), ("cpu_expert_layers", len(layers)),
                                         ("partial_experts", parts)) if k in searched})
    else:
        for name in ("n_cpu_moe", "cpu_expert_layers", "partial_experts"):
            if name in searched:
                params[name] = min(allowed(ctx.campaign, name))
        if "placement" in searched:
            params["placement"] = allowed(ctx.campaign, "placement")[0]
        fields["fit_override_tensors"] = tuple(patterns)
    if FOLLOW_LAYERS in (allowed(ctx.campaign, "expert_split") or []):  # as llama-fit-params placed them
        params["expert_split"] = FOLLOW_LAYERS
    if split is not None:
        if "tensor_split" in searched:
            params["tensor_split"] = allowed(ctx.campaign, "tensor_split")[0]
        fields["fit_tensor_split"] = split
    return params, fields


def _as_last(patterns: Sequence[str], count: int, n_gpu_layers: int, ctx: SearchContext,
             shape: ModelShape) -> int | None:
    """The partial_experts value with which `placement: last, cpu_expert_layers: count` moves the tensors llama-fit-
    params' `patterns` move, to the same places; None where no value the campaign allows does."""
    if "last" not in (allowed(ctx.campaign, "placement") or []) or \
            count not in (allowed(ctx.campaign, "cpu_expert_layers") or []):
        return None
    names = shape.tensor_names
    wanted = overridden(patterns, names)
    layers = cpu_expert_layers("last", count, shape.n_layers)
    split = partial_layer("last", layers, n_gpu_layers, shape.n_layers)
    for parts in allowed(ctx.campaign, "partial_experts") or [0]:
        if overridden((*expert_override(layers), *partial_override(split, parts)), names) == wanted:
            return parts
    return None
