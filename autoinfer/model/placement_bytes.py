"""Where a configuration puts the model's weights: bytes on the GPU and in system RAM, total and read per token.

llama.cpp's rules (src/llama-model.cpp, tools/llama-bench): the input layer (token_embd) always stays on the CPU;
with `-ngl N` the last N of the n_layers+1 "layers" (repeating blocks, then the output layer, which goes first)
live on the GPU; tensor overrides (`-ot regex=BUFFER`, std::regex_search, first match wins) then move single
tensors, and `-ncmoe K` appends one CPU override per layer 0..K-1 for the routed-expert tensors after the user's
patterns. Kept a small pure function over ModelInfo so a richer memory model can replace it.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from autoinfer.errors import UserError

GB = 1e9


class _Tensor(Protocol):
    name: str
    layer: int | None
    group: str
    n_bytes: int


class _Model(Protocol):
    n_layers: int
    n_experts: int
    n_experts_used: int
    tensors: Sequence[_Tensor]


@dataclass(frozen=True)
class PlacementBytes:
    """Weight bytes per side; `active_*` counts what one decoded token reads (top-k of the routed experts)."""

    gpu_bytes: int
    cpu_bytes: int
    active_gpu_bytes: float
    active_cpu_bytes: float

    @property
    def gpu_gb(self) -> float:
        return self.gpu_bytes / GB

    @property
    def cpu_gb(self) -> float:
        return self.cpu_bytes / GB

    @property
    def active_gpu_gb(self) -> float:
        return self.active_gpu_bytes / GB

    @property
    def active_cpu_gb(self) -> float:
        return self.active_cpu_bytes / GB


def ncmoe_patterns(n_cpu_moe: int) -> list[str]:
    """The overrides llama.cpp adds for `-ncmoe N` (common.h LLM_FFN_EXPS_REGEX, one per layer)."""
    return [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" for i in range(n_cpu_moe)]


def _compile(patterns: Iterable[str]) -> list[tuple[re.Pattern[str], bool]]:
    """(regex, goes_to_cpu) pairs; a buffer other than CPU (CUDA0, Vulkan1, …) is a device buffer."""
    out = []
    for pattern in patterns:
        regex, sep, buffer = pattern.rpartition("=")
        if not sep or not regex or not buffer:
            raise UserError(f"tensor override {pattern!r} is not 'regex=BUFFER'; e.g. 'blk\\.[0-9]+\\.ffn_.*_exps=CPU'")
        try:
            out.append((re.compile(regex), buffer.upper().startswith("CPU")))
        except re.error as exc:
            raise UserError(f"tensor override {pattern!r}: bad regex ({exc})") from None
    return out


def _active_fraction(model: _Model, group: str) -> float:
    """Share of a tensor a decoded token reads: the routed experts are read top-k of n; the embedding table one row."""
    if group == "routed_experts" and model.n_experts:
        return model.n_experts_used / model.n_experts
    if group == "embeddings":
        return 0.0
    return 1.0


def placement_bytes(model: _Model, n_gpu_layers: int, n_cpu_moe: int = 0,
                    override_tensors: Sequence[str] = (), *, gpu: bool = True) -> PlacementBytes:
    """Bytes of weights on each side for one configuration; with gpu=False (a CPU-only build) all stay in RAM."""
    first_gpu = max(model.n_layers + 1 - max(n_gpu_layers, 0), 0)
    rules = _compile([*override_tensors, *ncmoe_patterns(max(n_cpu_moe, 0))])
    totals = {True: 0, False: 0}
    active = {True: 0.0, False: 0.0}
    for t in model.tensors:
        if not gpu:
            on_cpu = True
        else:
            on_cpu = next((cpu for regex, cpu in rules if regex.search(t.name)), None)
            if on_cpu is None:
                if t.group == "embeddings" and t.name.startswith("token_embd"):
                    on_cpu = True
                else:
                    index = model.n_layers if t.layer is None else t.layer
                    on_cpu = index < first_gpu
        totals[on_cpu] += t.n_bytes
        active[on_cpu] += t.n_bytes * _active_fraction(model, t.group)
    return PlacementBytes(totals[False], totals[True], active[False], active[True])


_DEVICE_BUFFER = re.compile(r"[A-Za-z]+(\d+)")  # CUDA1, Vulkan0, ROCm1: the device's index among the visible ones


def layer_devices(n_layers: int, n_gpu_layers: int, shares: Sequence[float]) -> list[int | None]:
    """The device of each layer (index n_layers is the output layer); None: on the CPU. As llama_model::load_tensors
    does it: the offloaded layers are cut at the cumulative shares of the tensor split (upper_bound)."""
    first = max(n_layers + 1 - max(n_gpu_layers, 0), 0)
    active = min(max(n_gpu_layers, 0), n_layers + 1)
    total = sum(shares)
    points = [c / total for c in itertools.accumulate(shares)]
    out: list[int | None] = []
    for il in range(n_layers + 1):
        offloaded = first <= il and il - first < active
        out.append(min(bisect.bisect_right(points, (il - first) / active), len(shares) - 1) if offloaded else None)
    return out


def device_bytes(model: _Model, n_gpu_layers: int, n_cpu_moe: int, override_tensors: Sequence[str],
                 shares: Sequence[float]) -> tuple[int, ...]:
    """Weight bytes on each of len(shares) devices: layers by the tensor split, then `=CPU` / `=CUDAk` overrides
    (first match wins), the input embeddings on the CPU."""
    devices = layer_devices(model.n_layers, n_gpu_layers, shares)
    rules = []
    for pattern in (*override_tensors, *ncmoe_patterns(max(n_cpu_moe, 0))):
        regex, _, buffer = pattern.rpartition("=")
        named = _DEVICE_BUFFER.fullmatch(buffer)
        rules.append((re.compile(regex), None if buffer.upper().startswith("CPU") or named is None
                      else int(named.group(1))))
    totals = [0] * len(shares)
    for t in model.tensors:
        rule = next((device for regex, device in rules if regex.search(t.name)), -1)
        if rule == -1:
            rule = None if t.group == "embeddings" and t.name.startswith("token_embd") else \
                devices[model.n_layers if t.layer is None else t.layer]
        if rule is not None and rule < len(totals):
            totals[rule] += t.n_bytes
    return tuple(totals)
