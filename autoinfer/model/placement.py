"""llama.cpp's placement rules, in one place: which device each tensor lands on, and the tensor overrides autoinfer
writes for its placement knobs.

llama.cpp (src/llama-model.cpp, tools/llama-bench): the input layer (token_embd) always stays on the CPU; with
`-ngl N` the last N of the n_layers+1 "layers" (the repeating blocks, then the output layer) live on the GPUs, cut
between GPUs at the cumulative shares of the tensor split; tensor overrides (`-ot regex=BUFFER`, std::regex_search,
first match wins) then move single tensors, and `-ncmoe K` appends one CPU override per layer 0..K-1 for the
routed-expert tensors after the user's patterns.

A placement pattern names which layers keep their experts in system RAM: the first N (what `-ncmoe N` does), the
last N (what llama.cpp's `--fit` ends up with) or N spread evenly. Each becomes one `-ot` pattern without commas,
so it is valid both in llama-bench (where `,` separates configurations) and in llama-server. On several GPUs,
`expert_split` shares the experts that stay on the device between CUDA0, CUDA1, … in contiguous runs of layers
(one `=CUDAk` pattern per GPU); "layers" leaves them with their layer, wherever -sm/-ts put it.

`partial_experts` keeps part of one more layer's FFN in RAM, as llama-fit-params does for the layer at its boundary
(common/fit.cpp, LAYER_FRACTION_GATE and _UP): 1 its down projections, 2 its gate and down projections. Whole
layers move a layer's experts at a time (about 0.5 GB in the 35B-A3B Q4_K); at 12 GiB on an H100 fit's answer with
one layer's down projection in RAM read 3.5% fewer host bytes per token than the sweep's whole layers
(benchmarks/results/vs-fit-h100.md). The layer is the one the pattern would put in RAM next.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Protocol, Sequence

from autoinfer.errors import UserError
from autoinfer.trial_config import TrialConfig

GB = 1e9
PATTERNS = ("first", "last", "even")
PLACEMENT_KEYS = ("placement", "cpu_expert_layers", "partial_experts", "expert_split")  # become override_tensors
FOLLOW_LAYERS = "layers"  # expert_split value: no per-GPU expert overrides
GPU_SPLITS = ("tensor_split", "expert_split")  # how one model's layers and device experts are shared among GPUs
EXPERT_TENSORS = r"ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp common.h LLM_FFN_EXPS_REGEX
PARTIAL_TENSORS = {1: r"ffn_down.*", 2: r"ffn_(gate|gate_up|down).*"}  # llama-fit-params' patterns, byte for byte
_DEVICE_BUFFER = re.compile(r"[A-Za-z]+(\d+)")  # CUDA1, Vulkan0, ROCm1: the device's index among the visible ones
_LAYER = re.compile(r"blk\.(\d+)\.")


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


# --------------------------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Override:
    """One `regex=BUFFER` rule; `device` is the GPU index of a `CUDAk`-style buffer, None for host memory."""

    regex: re.Pattern[str]
    device: int | None


def parse_overrides(patterns: Iterable[str]) -> tuple[Override, ...]:
    """The rules of `-ot` patterns, in the order llama.cpp tries them; UserError for a malformed one."""
    out = []
    for pattern in patterns:
        regex, sep, buffer = pattern.rpartition("=")
        if not sep or not regex or not buffer:
            raise UserError(f"tensor override {pattern!r} is not 'regex=BUFFER'; e.g. 'blk\\.[0-9]+\\.ffn_.*_exps=CPU'")
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise UserError(f"tensor override {pattern!r}: bad regex ({exc})") from None
        named = _DEVICE_BUFFER.fullmatch(buffer)
        out.append(Override(compiled, None if buffer.upper().startswith("CPU") or named is None
                            else int(named.group(1))))
    return tuple(out)


def ncmoe_patterns(n_cpu_moe: int) -> list[str]:
    """The overrides llama.cpp adds for `-ncmoe N` (one per layer, after the user's)."""
    return [rf"blk\.{i}\.{EXPERT_TENSORS}=CPU" for i in range(max(n_cpu_moe, 0))]


def first_gpu_layer(n_gpu_layers: int, n_layers: int) -> int:
    """The first repeating layer llama.cpp offloads: the last n_gpu_layers − 1 layers and the output go to the GPU."""
    return max(n_layers + 1 - max(n_gpu_layers, 0), 0)


def cpu_layers(n_gpu_layers: int, n_layers: int, gpu: bool = True) -> int:
    """Repeating layers kept whole on the CPU (all of them on a build without a GPU backend, whatever -ngl says)."""
    return min(first_gpu_layer(n_gpu_layers, n_layers), n_layers) if gpu else n_layers


def layer_devices(n_layers: int, n_gpu_layers: int, shares: Sequence[float] = (1.0,)) -> list[int | None]:
    """The device of each layer (index n_layers is the output layer); None: on the CPU. As llama_model::load_tensors
    does it: the offloaded layers are cut at the cumulative shares of the tensor split (upper_bound)."""
    first = first_gpu_layer(n_gpu_layers, n_layers)
    active = min(max(n_gpu_layers, 0), n_layers + 1)
    total = sum(shares)
    points = [c / total for c in itertools.accumulate(shares)]
    out: list[int | None] = []
    for il in range(n_layers + 1):
        offloaded = first <= il and il - first < active
        out.append(min(bisect.bisect_right(points, (il - first) / active), len(shares) - 1) if offloaded else None)
    return out


def tensor_device(name: str, layer: int | None, n_layers: int, rules: Sequence[Override],
                  devices: Sequence[int | None]) -> int | None:
    """The device a tensor lands on (None: host memory): the first matching override, else the input embeddings on
    the CPU, else its layer's device (tensors outside blk.N belong to the output layer)."""
    for rule in rules:
        if rule.regex.search(name):
            return rule.device
    if name.startswith("token_embd"):
        return None
    return devices[n_layers if layer is None or layer > n_layers else layer]


def overridden(patterns: Sequence[str], tensor_names: Sequence[str]) -> dict[str, int | None]:
    """The tensors an override moves, each to the device of the first rule that matches it (None: host memory)."""
    rules = parse_overrides(patterns)
    out = {}
    for name in tensor_names:
        rule = next((r for r in rules if r.regex.search(name)), None)
        if rule is not None:
            out[name] = rule.device
    return out


def layers_on_cpu(patterns: Sequence[str], tensor_names: Sequence[str]) -> frozenset[int]:
    """The layers all of whose routed-expert tensors a CPU override matches (llama.cpp: first matching rule wins)."""
    experts = {name: int(m.group(1)) for name in tensor_names
               if (m := _LAYER.match(name)) and re.search(EXPERT_TENSORS, name)}
    moved = overridden(patterns, list(experts))
    per_layer: dict[int, list[bool]] = {}
    for name, layer in experts.items():
        per_layer.setdefault(layer, []).append(name in moved and moved[name] is None)
    return frozenset(i for i, flags in per_layer.items() if all(flags))


# ------------------------------------------------------------------------------------ autoinfer's patterns


def cpu_expert_layers(pattern: str, count: int, n_layers: int) -> tuple[int, ...]:
    """The layers whose routed experts stay in RAM for a pattern and a count (clamped to the model's layers)."""
    if pattern not in PATTERNS:
        raise UserError(f"placement {pattern!r} is not one of {', '.join(PATTERNS)}")
    count = max(0, min(int(count), n_layers))
    if pattern == "first":
        return tuple(range(count))
    if pattern == "last":
        return tuple(range(n_layers - count, n_layers))
    return tuple(sorted({int((i + 0.5) * n_layers / count) for i in range(count)})) if count else ()


def expert_override(layers: Sequence[int]) -> tuple[str, ...]:
    """One `regex=CPU` pattern for the experts of these layers; empty when there are none. Never contains a comma."""
    if not layers:
        return ()
    alternatives = "|".join(str(i) for i in sorted(set(layers)))
    return (rf"blk\.({alternatives})\.{EXPERT_TENSORS}=CPU",)


def partial_layer(pattern: str | None, in_ram: Iterable[int], n_gpu_layers: int, n_layers: int) -> int | None:
    """The layer whose FFN `partial_experts` splits: the one the pattern would put in RAM next, the highest GPU layer
    whose experts are on the GPU for "last" (where llama-fit-params puts it), else the lowest. None: there is none."""
    taken = set(in_ram)
    free = [i for i in range(first_gpu_layer(n_gpu_layers, n_layers), n_layers) if i not in taken]
    if not free:
        return None
    return max(free) if pattern == "last" else min(free)


def partial_override(layer: int | None, parts: int | None) -> tuple[str, ...]:
    """The `regex=CPU` pattern keeping `parts` of the layer's FFN projections in RAM; empty for none."""
    if layer is None or not parts:
        return ()
    if parts not in PARTIAL_TENSORS:
        raise UserError(f"partial_experts {parts!r} is not one of 0, 1 (down projections), 2 (gate and down)")
    return (rf"blk\.{layer}\.{PARTIAL_TENSORS[parts]}=CPU",)


def split_shares(split: str) -> tuple[float, ...]:
    """"3/1" → (3.0, 1.0), llama.cpp's tensor-split notation."""
    return tuple(float(v) for v in split.split("/"))


def gpu_expert_override(layers: Sequence[int], split: str) -> tuple[str, ...]:
    """`regex=CUDAk` patterns giving each GPU a contiguous run of these layers' experts, sized by its share of
    `split` (as -ts shares layers). A GPU whose share rounds to no layer gets no pattern."""
    layers = sorted(set(layers))
    shares = split_shares(split)
    total = sum(shares)
    bounds = [round(len(layers) * sum(shares[:k]) / total) for k in range(len(shares) + 1)]
    out = []
    for k in range(len(shares)):
        run = layers[bounds[k]:bounds[k + 1]]
        if run:
            out.append(rf"blk\.({'|'.join(map(str, run))})\.{EXPERT_TENSORS}=CUDA{k}")
    return tuple(out)


def realize(config: TrialConfig, n_layers: int) -> TrialConfig:
    """Turn the campaign's placement parameters (extra knobs) into tensor overrides llama.cpp understands: the CPU
    pattern first (llama.cpp takes the first rule that matches), then one pattern per GPU for the experts left on
    the device. Remembered: a search's every proposal realizes its candidates and trials again (a third of a
    150-trial replay's time went here)."""
    try:
        return _realized(config, n_layers)
    except TypeError:  # an engine knob whose value cannot be hashed: computed, not remembered
        return _realize(config, n_layers)


@lru_cache(maxsize=8192)
def _realized(config: TrialConfig, n_layers: int) -> TrialConfig:
    return _realize(config, n_layers)


def _realize(config: TrialConfig, n_layers: int) -> TrialConfig:
    pattern, count, parts, split = (config.get(k) for k in PLACEMENT_KEYS)
    if pattern is None and count is None and not parts and split is None:
        return config
    on_cpu = cpu_expert_layers(pattern or "first", count or 0, n_layers) if pattern or count else ()
    cpu = set(on_cpu) | set(range(min(config.n_cpu_moe, n_layers)))
    overrides = expert_override(on_cpu)
    overrides += partial_override(partial_layer(pattern, cpu, config.n_gpu_layers, n_layers), parts)
    if split not in (None, FOLLOW_LAYERS):
        on_gpu = [i for i in range(first_gpu_layer(config.n_gpu_layers, n_layers), n_layers) if i not in cpu]
        overrides += gpu_expert_override(on_gpu, split)
    extra = tuple((k, v) for k, v in config.extra if k not in PLACEMENT_KEYS)
    return config.with_(override_tensors=(*config.override_tensors, *overrides), extra=extra)


def command_key(config: TrialConfig, n_layers: int | None) -> str:
    """A key equal for configurations llama.cpp runs alike: placement realized as tensor overrides, so a pattern moot
    where no layer's experts, or every layer's, are in RAM names one command line (n_layers None: a model whose
    layout is unknown, the configuration as given)."""
    if n_layers is not None:
        config = realize(config, n_layers)
    return json.dumps(config.to_params(), sort_keys=True, default=str)


# ------------------------------------------------------------------------------------------ bytes per side


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
    rules = parse_overrides([*override_tensors, *ncmoe_patterns(n_cpu_moe)])
    devices = layer_devices(model.n_layers, n_gpu_layers)
    totals = {True: 0, False: 0}
    active = {True: 0.0, False: 0.0}
    for t in model.tensors:
        on_cpu = not gpu or tensor_device(t.name, t.layer, model.n_layers, rules, devices) is None
        totals[on_cpu] += t.n_bytes
        active[on_cpu] += t.n_bytes * _active_fraction(model, t.group)
    return PlacementBytes(totals[False], totals[True], active[False], active[True])


def device_bytes(model: _Model, n_gpu_layers: int, n_cpu_moe: int, override_tensors: Sequence[str],
                 shares: Sequence[float]) -> tuple[int, ...]:
    """Weight bytes on each of len(shares) devices: layers by the tensor split, then `=CPU` / `=CUDAk` overrides
    (first match wins), the input embeddings on the CPU."""
    rules = parse_overrides([*override_tensors, *ncmoe_patterns(n_cpu_moe)])
    devices = layer_devices(model.n_layers, n_gpu_layers, shares)
    totals = [0] * len(shares)
    for t in model.tensors:
        device = tensor_device(t.name, t.layer, model.n_layers, rules, devices)
        if device is not None and device < len(totals):
            totals[device] += t.n_bytes
    return tuple(totals)
