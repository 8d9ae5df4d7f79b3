"""A campaign made ready to run, once: the budgets for this run, the multi-GPU knobs this worker's GPUs add, the
thread counts of this machine's cores where the campaign asks for them, huge pages only where this host has them,
the engine created and its knobs checked against the space, Optuna's distributions, the models resolved to files and
the settings the engine imposes. The loop and the search read it; nothing is validated twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution
from rich.console import Console

from autoinfer.campaign.space import allowed, distributions
from autoinfer.campaign.spec import Campaign, check_space
from autoinfer.engines import base
from autoinfer.engines.base import Decision, Engine, TrialConfig
from autoinfer.errors import UserError
from autoinfer.measure.gpu import visible_gpus
from autoinfer.measure.host import huge_pages_refusal, usable_physical_cores
from autoinfer.model.placement import FOLLOW_LAYERS, GPU_SPLITS, split_shares

HOST = "host"  # space.threads: HOST searches this machine's own core counts (host_threads)
THREAD_SHARES = (0.5, 0.75, 1.0)


@dataclass(frozen=True)
class CampaignPlan:
    campaign: Campaign  # with this run's budgets, the multi-GPU knobs and this host's thread counts applied
    engine: Engine
    distributions: dict[str, BaseDistribution]
    models: dict[str, str]  # campaign model entry → the file (or label) the engine runs
    decisions: tuple[Decision, ...]  # settings the engine imposes on every trial here
    notes: tuple[str, ...] = ()  # what the loop decided about the space here, for the study's search notes


def plan(campaign: Campaign, *, trials: int | None = None, wall_s: float | None = None) -> CampaignPlan:
    """Check everything that can be checked before a study is opened, in the order that fails cheapest first: the
    space against the engine's knobs, every range, the memory budget against this machine, then the engine itself
    (which may build llama.cpp) and the models."""
    budget = campaign.budget.model_copy(update={k: v for k, v in (("trials", trials), ("wall_s", wall_s)) if v})
    campaign, threads = host_threads(multi_gpu_space(campaign.model_copy(update={"budget": budget})))
    engine = base.create(campaign.engine, **campaign.engine_options)
    check_space(campaign, engine.knobs)
    campaign, pages = host_huge_pages(campaign)
    mapped = huge_pages_on_mapped_weights(engine, campaign)
    dists = distributions(campaign)
    if base.capabilities(campaign.engine).host_measurement:  # a table's peaks need no GPU here
        check_vram_budget(campaign)
    engine.check()
    decisions = imposed_settings(engine, campaign)
    notes = tuple(n for n in [threads, pages, mapped, batches_run_smaller(engine, campaign)] if n)
    for note in notes:
        Console(stderr=True).print(f"decision: {note}", markup=False, soft_wrap=True)
    return CampaignPlan(campaign, engine, dists, engine.resolve_models(campaign.model), decisions, notes)


def host_threads(campaign: Campaign, cores: int | None = None) -> tuple[Campaign, str | None]:
    """`space.threads: host` as half, three quarters and all of this machine's usable physical cores (`cores`), and
    the decision in words; the campaign unchanged, and None, for any other threads value. A list written for one
    machine is wrong on the next: the shipped campaign's 8, 12, 16 left a 32-core two-H200 host's answer at 16
    threads, where 24 ran its decode 1.12 [1.06, 1.18] times as fast (benchmarks/results/vs-fit-h200x2.md). The
    study stores the values, so a resumed sweep or another worker of its hardware class searches the same ones."""
    if campaign.space.get("threads") != HOST:
        return campaign, None
    if not base.capabilities(campaign.engine).host_measurement:
        raise UserError(f"space.threads: {HOST!r} means this machine's cores, but engine {campaign.engine!r} measures "
                        "nothing here; list the thread counts its table holds")
    cores = usable_physical_cores() if cores is None else cores
    values = sorted({max(1, round(cores * share)) for share in THREAD_SHARES})
    note = (f"threads: {HOST} as {', '.join(map(str, values))}: half, three quarters and all of the {cores} physical "
            "core(s) this process may use")
    return campaign.model_copy(update={"space": {**campaign.space,
                                                 "threads": values if len(values) > 1 else values[0]}}), note


def host_huge_pages(campaign: Campaign) -> tuple[Campaign, str | None]:
    """`space.huge_pages` without 1 where this host cannot give llama.cpp's weights huge pages
    (measure.host.huge_pages_refusal), and the decision in words: such trials would run as 0 does and be recorded as
    1. A campaign that asks for 1 alone is refused. Unchanged, with None, where the host can, the space does not ask
    for 1, or the engine measures nothing here (a table's rows say what ran)."""
    asked = campaign.space.get("huge_pages")
    values = asked if isinstance(asked, list) else [] if asked is None else [0, 1] if isinstance(asked, dict) else [asked]
    if not any(v not in (0, False) for v in values) or not base.capabilities(campaign.engine).host_measurement:
        return campaign, None
    refusal = huge_pages_refusal()
    if refusal is None:
        return campaign, None
    if all(v not in (0, False) for v in values):
        raise UserError(f"space.huge_pages: 1 cannot run here: {refusal}; set huge_pages: 0 or drop it")
    note = f"huge_pages: 0 only: {refusal}, so 1 would run as 0"
    return campaign.model_copy(update={"space": {**campaign.space, "huge_pages": 0}}), note


def huge_pages_on_mapped_weights(engine: Engine, campaign: Campaign) -> str | None:
    """Which load modes of the space run huge_pages 1 as 0 here (Engine.as_run: llama.cpp keeps mapped weights as the
    file's pages, which huge pages do not move), in words: such configurations are measured once, as 0. A space whose
    every load mode does so for every huge_pages value it asks is refused: the knob could never act. None when 1 is
    not asked or acts with every load mode."""
    pages = allowed(campaign, "huge_pages") or []
    if not any(v not in (0, False) for v in pages):
        return None
    asked = TrialConfig.from_params({**campaign.fixed(), "model": "-", "huge_pages": 1})
    modes = allowed(campaign, "load_mode") or [asked.load_mode]
    mapped = [m for m in modes if not engine.as_run(asked.with_(load_mode=m)).get("huge_pages")]
    if not mapped:
        return None
    if len(mapped) == len(modes) and all(v not in (0, False) for v in pages):
        raise UserError(f"space.huge_pages: 1 does nothing with load_mode {', '.join(mapped)}: llama.cpp keeps the "
                        "weights in RAM as the model file's mapped pages there; add load_mode: none")
    return (f"huge_pages 1 with load_mode {', '.join(mapped)} runs as 0: llama.cpp keeps the weights in RAM as the "
            "model file's mapped pages there, which huge pages do not move, so such configurations are measured once, "
            "as 0")


def batches_run_smaller(engine: Engine, campaign: Campaign) -> str | None:
    """Which batch and ubatch values of the space run as smaller ones here (Engine.as_run): each such configuration
    is measured once, under the values that ran. None when every value runs as itself."""
    fixed = TrialConfig.from_params({**campaign.fixed(), "model": "-"})
    context = engine.batch_context(fixed)
    if context is None:
        return None
    moved = []
    for name in ("batch", "ubatch"):
        runs = {v: getattr(engine.as_run(fixed.with_(**{name: v})), name) for v in allowed(campaign, name) or []}
        smaller = {}
        for value, ran in runs.items():
            if ran != value:
                smaller.setdefault(ran, []).append(str(value))
        moved += [f"{name} {', '.join(values)} as {ran}" for ran, values in smaller.items()]
    if not moved:
        return None
    return (f"{'; '.join(moved)}: llama.cpp caps a batch at the context, here {context} tokens (the longest the "
            f"{campaign.engine} engine creates for this campaign's measure), and the ubatch at the batch, so such "
            "values are measured once, under the values that ran; raise measure.n_prompt to measure larger ones")


def imposed_settings(engine: Engine, campaign: Campaign) -> tuple[Decision, ...]:
    """What the engine imposes on every trial here (repack off on a build whose smoke run crashed with it on),
    printed once; a campaign that asks for another value of such a setting is refused, since its trials would
    measure something else than they say."""
    decisions = engine.decisions()
    for d in decisions:
        asked = campaign.space.get(d.knob)
        values = asked if isinstance(asked, list) else [] if asked is None else [asked]
        if any(v != d.value for v in values):
            raise UserError(f"space.{d.knob}: this machine's llama.cpp build needs {d.knob}={d.value} ({d.reason}); "
                            f"set {d.knob}: {d.value} or drop it from the space")
        Console(stderr=True).print(f"decision: every trial runs with {d.knob}={d.value}: {d.reason}",
                                   markup=False, soft_wrap=True)
    return decisions


def split_choices(n_gpus: int) -> list[str]:
    """Tensor splits worth trying on n GPUs: equal, the first GPU heavier (it also holds the output and KV cache
    with split_mode row), the last one heavier."""
    equal = ["1"] * n_gpus
    return ["/".join(equal), "/".join(["2", *equal[1:]]), "/".join([*equal[:-1], "2"])]


def check_split_counts(campaign: Campaign, n_gpus: int) -> None:
    """A tensor or expert split names one share per GPU; a share for a GPU this worker does not see is an error
    now, not a failed load in every trial."""
    for name in GPU_SPLITS:
        spec = campaign.space.get(name)
        for value in spec if isinstance(spec, list) else [spec] if isinstance(spec, str) else []:
            if value != FOLLOW_LAYERS and len(split_shares(value)) != n_gpus:
                raise UserError(f"space.{name}: {value!r} gives {len(split_shares(value))} GPU share(s) but this "
                                f"worker sees {n_gpus} GPU(s); give one share per GPU (CUDA_VISIBLE_DEVICES, --gpus)")


def check_vram_budget(campaign: Campaign, n_gpus: int | None = None) -> None:
    """A device-memory budget needs a device: on a machine without a GPU every trial would pass it unmeasured and
    the sweep would recommend a configuration as fitting a budget nothing checked."""
    limit = campaign.constraints.vram_mib
    if limit is None:
        return
    n_gpus = len(visible_gpus()) if n_gpus is None else n_gpus
    if n_gpus == 0:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
        raise UserError(f"constraints.vram_mib is {limit:g} MiB but this machine has no NVIDIA GPU that NVML "
                        f"sees{where}; remove constraints.vram_mib for a CPU campaign, or run it on a GPU machine")


def multi_gpu_space(campaign: Campaign, n_gpus: int | None = None) -> Campaign:
    """The campaign with llama.cpp's multi-GPU knobs searched when this worker sees more than one GPU and the
    campaign does not set them itself: tensor_split and, where the campaign places experts, expert_split (which
    GPU holds the experts left on the device). Every worker of a study is of one hardware class, so they all see
    the same GPU count and the same space.

    split_mode stays llama.cpp's default (layer) unless the campaign searches it: on two H200s with llama.cpp
    0c1e570, `-sm row` fails to load a qwen35moe model (no split buffers) and `-sm tensor` aborts, so adding them
    would only spend trials on failures (benchmarks/results/multi-gpu-h200x2.md)."""
    if not base.capabilities(campaign.engine).runs_llama_tools:  # nothing runs on this worker's GPUs
        return campaign
    n_gpus = len(visible_gpus()) if n_gpus is None else n_gpus
    check_split_counts(campaign, n_gpus)
    if n_gpus < 2:
        return campaign
    added: dict[str, Any] = {"tensor_split": split_choices(n_gpus)}
    if any(k in campaign.space for k in ("n_cpu_moe", "placement", "cpu_expert_layers")):
        added["expert_split"] = [FOLLOW_LAYERS, *split_choices(n_gpus)]
    return campaign.model_copy(update={"space": {**added, **campaign.space}})
