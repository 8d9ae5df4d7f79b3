"""The parameters an engine takes and the values each one accepts.

Every engine declares its knobs as a mapping of name → Knob (engines.base.Engine.knobs), so a campaign is checked
against the engine it names when the file is read: a value the engine would reject fails then, with one line
naming the fix, instead of as a trial. The TrialConfig fields have one definition here, shared by every engine
that takes them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import psutil

from autoinfer.model.placement import FOLLOW_LAYERS, PATTERNS
from autoinfer.trial_config import TrialConfig

FLASH_ATTN = ("auto", "on", "off")
KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
LOAD_MODES = ("mmap", "none", "mlock", "mmap+mlock", "dio")
_SPLIT = re.compile(r"\d+(\.\d+)?(/\d+(\.\d+)?)+")  # a share per GPU, llama.cpp's "3/1"


@dataclass(frozen=True)
class Knob:
    """What one parameter accepts. `problem(value)` says what is wrong with a value, None when it is fine."""

    check: Callable[[Any], str | None]

    def problem(self, value: Any) -> str | None:
        return self.check(value)


def choice(*values: str) -> Knob:
    """One of a fixed set of strings."""
    return Knob(lambda v: None if str(v) in values else f"{v!r} is not one of {', '.join(values)}")


def count() -> Knob:
    """A non-negative number."""
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{v!r} is not a number"
        return f"{v!r} is negative" if v < 0 else None
    return Knob(check)


def rule(valid: Callable[[Any], bool], what: str) -> Knob:
    """Any value `valid` accepts; `what` says in words what a valid value is."""
    return Knob(lambda v: None if valid(v) else f"{v!r} is not valid; give {what}")


def _int_in(low: int, high: int | None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v and (high is None or v <= high)


ANY = Knob(lambda v: None)
FLAG = rule(lambda v: v in (0, 1), "0, 1, true or false")

#: The TrialConfig fields, as every engine that takes them accepts them.
TRIAL_KNOBS: dict[str, Knob] = {
    "model": ANY, "n_gpu_layers": count(), "n_cpu_moe": count(), "override_tensors": ANY, "threads": count(),
    "batch": count(), "ubatch": count(), "type_k": choice(*KV_TYPES), "type_v": choice(*KV_TYPES),
    "flash_attn": choice(*FLASH_ATTN), "load_mode": choice(*LOAD_MODES), "n_prompt": count(), "n_gen": count(),
    "repetitions": count(),
}

#: The knob a campaign's serve.context sets, by engine: llama-server's and llama-cpp-python's context; the reference
#: engine sizes its static state by max_context. An engine without that knob (llama-bench, a replay table) measures a
#: shorter context, and the memory budget counts the rest (search.context.SearchContext.context_growth).
CONTEXT_KNOB = {"reference": "max_context"}


def context_knob(engine: str) -> str:
    return CONTEXT_KNOB.get(engine, "ctx_size")


#: Campaign parameters that become tensor overrides (model.placement.realize) for engines that take overrides.
PLACEMENT_KNOBS: dict[str, Knob] = {
    "placement": choice(*PATTERNS),
    "cpu_expert_layers": count(),
    "partial_experts": rule(lambda v: v in (0, 1, 2), "0, 1 (one more layer's down projections in RAM) or 2 (its gate "
                            "and down projections)"),
    "expert_split": rule(lambda v: v == FOLLOW_LAYERS or isinstance(v, str) and _SPLIT.fullmatch(v) is not None,
                         f'{FOLLOW_LAYERS!r} or a quoted share of the device-resident experts per GPU, such as "3/1"'),
}

#: Several GPUs (autoinfer.campaign.plan.multi_gpu_space).
MULTI_GPU_KNOBS: dict[str, Knob] = {
    "split_mode": rule(lambda v: v in ("none", "layer", "row", "tensor"), "none, layer, row or tensor"),
    "tensor_split": rule(lambda v: isinstance(v, str) and _SPLIT.fullmatch(v) is not None,
                         'a quoted share per GPU separated by "/", such as "3/1"'),
    "main_gpu": rule(_int_in(0, None), "a GPU index, 0 or more"),
}

#: llama-bench's priority and thread placement.
BENCH_KNOBS: dict[str, Knob] = {
    "prio": rule(_int_in(-1, 3), "an integer from -1 (low) to 3 (realtime)"),
    "cpu_mask": rule(lambda v: isinstance(v, str) and re.fullmatch(r"(0x)?[0-9a-fA-F]+", v) is not None,
                     'a quoted hex CPU mask such as "0x3" (unquoted, YAML reads 0x3 as the number 3)'),
    "cpu_strict": FLAG,
    "delay": rule(_int_in(0, None), "a whole number of seconds, 0 or more"),
    "poll": rule(_int_in(0, 100), "an integer from 0 to 100"),
    "repack": rule(lambda v: v in (0, 1), "0 or 1 (weight repacking off or on), or false/true"),
    "huge_pages": rule(lambda v: v in (0, 1), "0 or 1 (the weights in host memory on transparent huge pages: "
                       "engines.llama_common.HUGE_PAGES), or false/true"),
}


#: Every knob a llama.cpp engine has, for a table of llama.cpp measurements (the replay engine).
LLAMA_KNOBS: dict[str, Knob] = {**TRIAL_KNOBS, **PLACEMENT_KNOBS, **MULTI_GPU_KNOBS, **BENCH_KNOBS}


def llama_preferred_values(device_budget: bool) -> dict[str, Any]:
    """With a device budget, llama.cpp loads better without mmap: it then keeps the experts it leaves in host memory
    in pinned buffers, which op offload copies to the GPU several times faster
    (benchmarks/results/load-mode-h200.md: pp512 2034 vs 435 tok/s, tg 74.6 vs 67.7), or, with huge_pages, in
    malloc's memory on huge pages, where a decode step reads them faster: tg 1.22 [1.11, 1.35] times pinned's, the
    prompt at mmap's speed, on an H200 host (benchmarks/results/huge-pages.md). The first trials take the decode's
    side; pinned buffers are one move away. Without a device budget llama.cpp's default (huge_pages 0, mmap): a
    CPU host measured no difference beyond its scatter, 1.04 [0.97, 1.14]."""
    return {"load_mode": "none", "huge_pages": 1} if device_budget else {"huge_pages": 0}


def llama_defaults() -> dict[str, Any]:
    """What llama.cpp runs each TrialConfig knob at when a user sets nothing: the TrialConfig defaults, and for
    threads its default count on this host, the physical cores (common_cpu_get_num_math; on an Intel hybrid CPU it
    counts the performance cores only, which psutil cannot tell apart)."""
    runtime = ("batch", "ubatch", "type_k", "type_v", "flash_attn", "load_mode")
    out: dict[str, Any] = {f.name: f.default for f in fields(TrialConfig) if f.name in runtime}
    return {**out, "threads": psutil.cpu_count(logical=False) or os.cpu_count()}


def with_placement(knobs: Mapping[str, Knob]) -> dict[str, Knob]:
    """The parameters a campaign may set for an engine with these knobs: an engine that takes tensor overrides also
    takes the placement parameters that become them."""
    return {**knobs, **(PLACEMENT_KNOBS if "override_tensors" in knobs else {})}
