"""The reference engine's knobs, declared once: `EngineOptions`. The engine is built from it, the worker's command
line is made from its fields (`to_argv` / `parse_argv`), and the `reference` campaign engine (engines/reference.py)
accepts exactly these names in a campaign's space and asks `check()` why a combination would be refused.

This module imports no torch at import time: the sweep reads the knob names without loading the engine.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from autoinfer.errors import UserError

DEVICES = ("cpu", "cuda")
WEIGHTS = ("dense", "gguf")  # dense: decoded to `dtype` at load; gguf: Q8_0/Q4_K/Q6_K matrices stay in their blocks
POLICIES = ("lru", "lfu")
MISSES = ("copy", "cpu")  # where an expert-cache miss is computed: copied into a device slot, or on the host
_TRUE, _FALSE = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


@dataclass(frozen=True)
class EngineOptions:
    """What a sweep searches. expert_slots = 0 keeps every expert on the device; budget_mib instead sizes the expert
    cache so that the device holds the weights, the state and a reserve within that many MiB. weights="gguf" keeps
    the quantized matrices in their GGUF blocks (Triton kernels read them); dtype is then the activations' dtype.
    prefetch = n copies the experts that the next n layers' routers predict from the current hidden state.
    misses = "cpu" computes an expert-cache miss that one token needs on the host instead of copying the expert.
    norm = "triton" runs each RMSNorm (and the GDN output gate) as one kernel instead of a torch composition.
    graphs replays decode steps from a CUDA graph over one static state of max_context positions; with an expert
    cache the step looks experts up on the device (prefetch must then be 0). Without graphs a sequence's state holds
    max_context positions from the start and grows beyond them."""

    device: str = "cpu"
    dtype: str = "fp32"
    weights: str = "dense"
    gdn: str = "chunk"
    moe: str = "grouped"
    norm: str = "torch"
    prefill_chunk: int = 512
    torch_threads: int | None = None
    expert_slots: int = 0
    budget_mib: float | None = None
    cache_policy: str = "lru"
    prefetch: int = 0
    misses: str = "copy"
    snapshots: bool = False
    graphs: bool = False
    max_context: int = 4096

    @classmethod
    def from_knobs(cls, values: Mapping[str, Any]) -> "EngineOptions":
        """From campaign values or command-line strings: each converted to its field's type (bools also from
        on/off), an unknown name or a value of the wrong kind a UserError naming the knob."""
        unknown = sorted(set(values) - set(KNOBS))
        if unknown:
            raise UserError(f"{unknown[0]!r} is not a reference-engine knob; the knobs are {', '.join(KNOBS)}")
        return cls(**{name: _convert(name, value) for name, value in values.items()})

    def to_argv(self) -> list[str]:
        """The worker's flags for every knob that differs from its default."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                argv += [flag(f.name), ("on" if value else "off") if isinstance(value, bool) else str(value)]
        return argv

    def check(self) -> None:
        """A UserError saying why the engine would refuse these options (imports torch and the op registries)."""
        import torch

        from autoinfer.refengine.loader import torch_dtype
        from autoinfer.refengine.ops import gdn as gdn_ops
        from autoinfer.refengine.ops import moe as moe_ops
        from autoinfer.refengine.ops import norm as norm_ops
        from autoinfer.refengine.ops.quant.kernels import check_device

        _choice("device", self.device, DEVICES)
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError("device 'cuda' asked for, but this torch sees no CUDA GPU; use device: cpu")
        torch_dtype(self.dtype)
        gdn_ops.get(self.gdn)
        moe_ops.get(self.moe)
        norm_ops.get(self.norm)
        _choice("weights", self.weights, WEIGHTS)
        _choice("cache_policy", self.cache_policy, POLICIES)
        _choice("misses", self.misses, MISSES)
        if (self.weights == "gguf" or self.gdn in gdn_ops.TRITON or self.moe in moe_ops.READS_BLOCKS
                or self.norm in norm_ops.TRITON):
            check_device(self.device)
        if self.moe in moe_ops.READS_BLOCKS and self.weights != "gguf":
            raise UserError(f"moe variant {self.moe!r} reads experts kept in GGUF blocks: set weights: gguf "
                            "(or use moe: grouped with dense weights)")
        for name in ("prefill_chunk", "max_context"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be ≥ 1 (got {getattr(self, name)})")
        if self.expert_slots < 0:
            raise UserError(f"expert_slots must be ≥ 0 (got {self.expert_slots}); 0 keeps all experts resident")
        if self.prefetch < 0:
            raise UserError(f"prefetch must be ≥ 0 layers ahead (got {self.prefetch})")
        if self.budget_mib is not None and (self.budget_mib <= 0 or self.expert_slots):
            raise UserError("budget_mib sizes the expert cache itself: give it (> 0) or expert_slots, not both")
        if self.misses == "cpu" and not self.expert_slots and self.budget_mib is None:
            raise UserError("misses: cpu says where an expert cache's misses are computed, and every expert is on the "
                            "device: set expert_slots or budget_mib (or misses: copy)")
        if self.misses == "cpu" and self.graphs:
            raise UserError("misses: cpu computes misses on the host, but under graphs: on the decode step reads "
                            "them from host memory on the device itself: use misses: copy (or graphs: off)")
        if self.graphs:
            self._check_graphs(moe_ops.CAPTURE_SAFE, gdn_ops.CAPTURE_SAFE)

    def _check_graphs(self, moe_safe: set[str], gdn_safe: set[str]) -> None:
        if self.device != "cuda":
            raise UserError("graphs: on records the decode step as a CUDA graph, which needs device: cuda "
                            "(use graphs: off on the CPU)")
        if (self.expert_slots or self.budget_mib is not None) and self.prefetch:
            raise UserError("graphs: on with an expert cache (expert_slots or budget_mib) needs prefetch: 0: the "
                            "step looks experts up on the device and reads misses from host memory itself, while "
                            "prefetch decides on the host at every layer which experts to copy")
        if self.moe not in moe_safe:
            raise UserError(f"graphs: on needs a moe variant that never reads the device back "
                            f"({', '.join(sorted(moe_safe))}); {self.moe!r} reads the routing choices")
        if self.gdn not in gdn_safe:
            raise UserError(f"graphs: on needs a gdn variant a CUDA graph can record "
                            f"({', '.join(sorted(gdn_safe))}), not {self.gdn!r}")


KNOBS: tuple[str, ...] = tuple(f.name for f in fields(EngineOptions))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One optional string flag per knob (converted by from_knobs, so the command line and a campaign agree)."""
    for name in KNOBS:
        parser.add_argument(flag(name), dest=name, default=None)


def from_namespace(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions.from_knobs({name: getattr(args, name) for name in KNOBS if getattr(args, name) is not None})


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{name} {value!r} is not one of {', '.join(choices)}")


def _convert(name: str, value: Any) -> Any:
    field = next(f for f in fields(EngineOptions) if f.name == name)
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    if value is None:
        if "None" in kind or field.default is None or field.default is MISSING:
            return None
        raise UserError(f"{name} needs a value")
    try:
        if kind.startswith("bool"):
            text = str(value).lower()
            if isinstance(value, bool):
                return value
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(value)
        if kind.startswith("int"):  # a bool is 0/1 (prefetch: true is one layer ahead)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            text = str(value).lower()
            return int(text in _TRUE) if text in ("true", "false") else int(value)
        if kind.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise UserError(f"{name}: {value!r} is not a valid {kind.split(' ')[0]} (see the reference engine's knobs "
                        "in README)") from None
