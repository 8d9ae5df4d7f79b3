"""Where the routed experts go, as llama.cpp tensor overrides, and how much device memory a configuration needs.

A placement pattern names which layers keep their experts in system RAM: the first N (what `-ncmoe N` does), the
last N (what llama.cpp's `--fit` ends up with) or N spread evenly. Each becomes one `-ot` pattern without commas,
so it is valid both in llama-bench (where `,` separates configurations) and in llama-server. On several GPUs,
`expert_split` shares the experts that stay on the device between CUDA0, CUDA1, … in contiguous runs of layers
(one `=CUDAk` pattern per GPU); "layers" leaves them with their layer, wherever -sm/-ts put it.

The memory model adds what a configuration puts in device memory (or, on a CPU-only build, in RAM): weights
(byte accounting from autoinfer.model.placement_bytes), KV cache and recurrent state for the context, compute
buffers that grow with ubatch, and the staging copy of host-resident experts that op offload makes during prompt
processing. It starts from these physical estimates and is calibrated online (Bayesian linear regression) from
the peaks measured by finished trials, so its error shrinks as the campaign runs and is always reported. On several
GPUs it predicts each GPU's peak (a per-GPU budget binds on the fullest one): the same terms per device, with the
layers cut by the tensor split as llama.cpp cuts them, and one calibration fitted to every GPU's measured peak.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from autoinfer.errors import UserError
from autoinfer.model.placement_bytes import device_bytes, layer_devices, placement_bytes
from autoinfer.trial_config import TrialConfig

MIB = 1024 * 1024
PATTERNS = ("first", "last", "even")
PLACEMENT_KEYS = ("placement", "cpu_expert_layers", "expert_split")  # campaign parameters turned into override_tensors
FOLLOW_LAYERS = "layers"  # expert_split value: no per-GPU expert overrides
EXPERT_TENSORS = r"ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp common.h LLM_FFN_EXPS_REGEX
OP_OFFLOAD_MIN_BATCH = 32  # GGML_OP_OFFLOAD_MIN_BATCH: from this ubatch on, host experts are copied to the GPU

# Bytes per element of the KV cache types (ggml block size 32 for the quantized ones).
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
            "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}


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


def layers_on_cpu(patterns: Sequence[str], tensor_names: Sequence[str]) -> frozenset[int]:
    """The layers all of whose routed-expert tensors a CPU override matches (llama.cpp: first matching rule wins)."""
    rules = []
    for p in patterns:
        regex, _, buffer = p.rpartition("=")
        rules.append((re.compile(regex), buffer.upper().startswith("CPU")))
    per_layer: dict[int, list[bool]] = {}
    for name in tensor_names:
        m = re.match(r"blk\.(\d+)\.", name)
        if m and re.search(EXPERT_TENSORS, name):
            on_cpu = next((cpu for regex, cpu in rules if regex.search(name)), False)
            per_layer.setdefault(int(m.group(1)), []).append(on_cpu)
    return frozenset(i for i, flags in per_layer.items() if all(flags))


@dataclass(frozen=True)
class TensorBytes:
    name: str
    layer: int | None
    group: str
    n_bytes: int


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about a model: tensors with their bytes and the cache dimensions.

    Built from a GGUF (`shape_from_gguf`) or from the JSON beside a replay table, so that a table measured on
    another machine can still be searched with the memory model.
    """

    n_layers: int
    n_experts: int
    n_experts_used: int
    hidden: int
    vocab: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    expert_ff: int
    attention_layers: tuple[int, ...]
    recurrent_state_bytes: int  # per recurrent (GDN) layer and sequence: f32 SSM state + conv state
    tensors: tuple[TensorBytes, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ModelShape":
        data = json.loads(text)
        data["attention_layers"] = tuple(data["attention_layers"])
        data["tensors"] = tuple(TensorBytes(**t) for t in data["tensors"])
        return cls(**data)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)


def shape_from_gguf(path: Path) -> ModelShape:
    """The shape of a qwen35moe-family GGUF: byte accounting from gguf_info, cache dimensions from its metadata
    (both from the bounded header reader: the tokenizer is counted, never materialised)."""
    from autoinfer.model.gguf_header import ArrayCount
    from autoinfer.model.gguf_info import read_info

    info = read_info(path)
    arch = info.arch

    def meta(key: str, default: int = 0) -> int:
        """A non-negative integer key; a per-layer array gives its first layer's value, as llama.cpp's default."""
        value = info.metadata.get(f"{arch}.{key}", default)
        if isinstance(value, list) and value:
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UserError(f"{path}: {arch}.{key} is {value!r}, not a non-negative integer; the file is corrupt, "
                            "re-convert or re-create it")
        return value

    n_head = meta("attention.head_count")
    key_length = meta("attention.key_length", info.hidden // max(n_head, 1))
    state, groups, dt_rank = meta("ssm.state_size"), meta("ssm.group_count"), meta("ssm.time_step_rank")
    conv = meta("ssm.conv_kernel")
    channels = 2 * state * groups + meta("ssm.inner_size")
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    vocab = (tokens.length if isinstance(tokens, ArrayCount) else len(tokens) if isinstance(tokens, list)
             else meta("vocab_size"))
    return ModelShape(
        n_layers=info.n_layers, n_experts=info.n_experts, n_experts_used=info.n_experts_used, hidden=info.hidden,
        vocab=vocab, n_head=n_head, n_head_kv=meta("attention.head_count_kv", n_head), key_length=key_length,
        value_length=meta("attention.value_length", key_length), expert_ff=meta("expert_feed_forward_length"),
        attention_layers=tuple(info.attention_layers),
        recurrent_state_bytes=4 * (dt_rank * state * state + max(conv - 1, 0) * channels),
        tensors=tuple(TensorBytes(t.name, t.layer, t.group, int(t.n_bytes)) for t in info.tensors),
    )


def first_gpu_layer(n_gpu_layers: int, n_layers: int) -> int:
    """The first repeating layer llama.cpp offloads: the last n_gpu_layers − 1 layers and the output go to the GPU."""
    return max(n_layers + 1 - max(n_gpu_layers, 0), 0)


def cpu_layers(n_gpu_layers: int, n_layers: int, gpu: bool = True) -> int:
    """Repeating layers kept whole on the CPU (all of them on a build without a GPU backend, whatever -ngl says)."""
    return min(first_gpu_layer(n_gpu_layers, n_layers), n_layers) if gpu else n_layers


def realize(config: TrialConfig, n_layers: int) -> TrialConfig:
    """Turn the campaign's placement parameters (extra knobs) into tensor overrides llama.cpp understands: the CPU
    pattern first (llama.cpp takes the first rule that matches), then one pattern per GPU for the experts left on
    the device."""
    pattern, count, split = (config.get(k) for k in PLACEMENT_KEYS)
    if pattern is None and count is None and split is None:
        return config
    on_cpu = cpu_expert_layers(pattern or "first", count or 0, n_layers) if pattern or count else ()
    overrides = expert_override(on_cpu)
    if split not in (None, FOLLOW_LAYERS):
        cpu = set(on_cpu) | set(range(min(config.n_cpu_moe, n_layers)))
        on_gpu = [i for i in range(first_gpu_layer(config.n_gpu_layers, n_layers), n_layers) if i not in cpu]
        overrides += gpu_expert_override(on_gpu, split)
    extra = tuple((k, v) for k, v in config.extra if k not in PLACEMENT_KEYS)
    return config.with_(override_tensors=(*config.override_tensors, *overrides), extra=extra)


# --------------------------------------------------------------------------------------------- memory model

Side = Literal["device", "host"]
FEATURES = ("weights", "cache", "compute", "offload_copy", "overhead")


@dataclass(frozen=True)
class Prediction:
    """On several GPUs: the fullest GPU's prediction, with every GPU's mean in `per_device`."""

    mib: float
    std_mib: float  # predictive standard deviation: prior uncertainty shrunk by the measured trials
    parts: dict[str, float]  # MiB per feature, before calibration
    per_device: tuple[float, ...] = ()

    def over(self, budget_mib: float, z: float) -> bool:
        """Confidently over the budget: even `z` standard deviations below the prediction does not fit."""
        return self.mib - z * self.std_mib > budget_mib


@dataclass(frozen=True)
class Calibration:
    """Posterior of the per-feature coefficients; `loo_rel_error` is the leave-one-out median |error|/measured."""

    mean: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    noise_mib: float
    n: int
    loo_rel_error: float | None


class MemoryModel:
    """Predicts the peak memory of a configuration on one side (device memory, or RAM for a CPU-only build)."""

    # Prior: each physical term counts once; a fixed overhead (CUDA context, runtime libraries) on top.
    PRIOR_SCALE = (0.15, 0.5, 1.0, 1.0, 400.0)  # prior standard deviations of the coefficients (overhead in MiB)

    def __init__(self, shape: ModelShape, side: Side = "device", n_devices: int = 1) -> None:
        self.shape = shape
        self.side = side
        self.n_devices = n_devices if side == "device" else 1
        self.prior_mean = np.array([1.0, 1.0, 1.0, 1.0, 300.0 if side == "device" else 16.0])
        self.calibration = Calibration(tuple(self.prior_mean), tuple(map(tuple, np.diag(np.square(self.PRIOR_SCALE)))),
                                       noise_mib=32.0, n=0, loo_rel_error=None)
        self._features = lru_cache(maxsize=4096)(self._compute_features)

    # -- features ---------------------------------------------------------------------------------------
    def features(self, config: TrialConfig) -> np.ndarray:
        """One row of features per device (a single row on one GPU or on the host side)."""
        split = config.get("tensor_split")
        shares = split_shares(split) if split else (1.0,) * self.n_devices
        key = (config.n_gpu_layers, config.n_cpu_moe, tuple(realize(config, self.shape.n_layers).override_tensors),
               config.ubatch, config.batch, config.type_k, config.type_v, config.flash_attn,
               config.n_prompt + config.n_gen + int(config.get("n_depth", 0) or 0), shares)
        return self._features(key)

    def _compute_features(self, key: tuple[Any, ...]) -> np.ndarray:
        ngl, ncmoe, overrides, ubatch, batch, type_k, type_v, flash_attn, n_ctx, shares = key
        s = self.shape
        gpu = self.side == "device"
        n_ctx = 256 * math.ceil(max(n_ctx, 1) / 256)  # llama_context pads the context to 256
        kv_per_token = s.n_head_kv * (s.key_length * KV_BYTES.get(type_k, 2.0) + s.value_length * KV_BYTES.get(type_v, 2.0))
        ub = max(1, min(ubatch, batch))
        scores = 0 if flash_attn == "on" else 4 * s.n_head * n_ctx
        per_token = 4 * (s.n_experts + 8 * s.hidden + 3 * s.n_experts_used * s.expert_ff)  # logits: output's device
        offload_copy = 0.0
        if gpu and ub >= OP_OFFLOAD_MIN_BATCH:
            cpu_layers = layers_on_cpu([*overrides, *(rf"blk\.{i}\.{EXPERT_TENSORS}=CPU" for i in range(ncmoe))],
                                       s.tensor_names)
            per_layer = {}
            for t in s.tensors:
                if t.group == "routed_experts" and t.layer in cpu_layers:
                    per_layer[t.layer] = max(per_layer.get(t.layer, 0), t.n_bytes)
            offload_copy = max(per_layer.values(), default=0)

        def cache_of(layers: list[int]) -> float:
            n_attention = sum(1 for i in layers if i in s.attention_layers)
            return n_ctx * kv_per_token * n_attention + s.recurrent_state_bytes * (len(layers) - n_attention)

        if self.n_devices == 1:
            weights = placement_bytes(s, ngl, ncmoe, overrides, gpu=gpu)
            first_gpu = first_gpu_layer(ngl, s.n_layers)
            cache = cache_of([i for i in range(s.n_layers) if not gpu or i >= first_gpu])
            compute = ub * (per_token + 4 * s.vocab + scores)
            return np.array([[weights.gpu_bytes if gpu else weights.cpu_bytes + weights.gpu_bytes,
                              cache, compute, offload_copy, MIB]]) / MIB
        devices = layer_devices(s.n_layers, ngl, shares)
        weights_k = device_bytes(s, ngl, ncmoe, overrides, shares)
        rows = []
        for k in range(len(shares)):
            cache = cache_of([i for i in range(s.n_layers) if devices[i] == k])
            compute = ub * (per_token + scores + (4 * s.vocab if devices[s.n_layers] == k else 0))
            rows.append([weights_k[k], cache, compute, offload_copy if k == 0 else 0.0, MIB])
        return np.array(rows) / MIB

    # -- prediction and calibration -------------------------------------------------------------------------
    def predict(self, config: TrialConfig) -> Prediction:
        rows = self.features(config)
        c = self.calibration
        mean, cov = np.array(c.mean), np.array(c.cov)
        means = rows @ mean
        x = rows[int(np.argmax(means))]
        var = c.noise_mib ** 2 + float(x @ cov @ x)
        return Prediction(float(x @ mean), math.sqrt(var), {k: float(v) for k, v in zip(FEATURES[:-1], x[:-1])},
                          tuple(float(m) for m in means) if len(rows) > 1 else ())

    def calibrate(self, observations: Sequence[tuple[TrialConfig, float | Sequence[float]]]) -> Calibration:
        """Refit the coefficients to measured peaks (MiB: one per trial, or one per GPU on several GPUs); keeps the
        prior where the data say nothing."""
        obs = []
        for config, peaks in observations:
            rows = self.features(config)
            values = [peaks] if isinstance(peaks, (int, float)) or peaks is None else list(peaks)
            if len(values) == len(rows):
                obs += [(x, float(y)) for x, y in zip(rows, values) if y is not None and y > 0]
        if not obs:
            return self.calibration
        X = np.array([x for x, _ in obs])
        y = np.array([v for _, v in obs])
        noise = self._noise(X, y)
        mean, cov = self._posterior(X, y, noise)
        self.calibration = Calibration(tuple(mean), tuple(map(tuple, cov)), noise, len(obs), self._loo(X, y, noise))
        return self.calibration

    def _posterior(self, X: np.ndarray, y: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
        prior_precision = np.diag(1.0 / np.square(self.PRIOR_SCALE))
        precision = prior_precision + X.T @ X / noise ** 2
        cov = np.linalg.inv(precision)
        mean = cov @ (prior_precision @ self.prior_mean + X.T @ y / noise ** 2)
        return mean, cov

    def _noise(self, X: np.ndarray, y: np.ndarray) -> float:
        """Measurement noise: at least 1 MiB or 1% of the peak (5% while there are too few trials to fit it);
        larger when the residuals of a fit say so."""
        floor = max(1.0, 0.01 * float(np.median(y)))
        if len(y) <= X.shape[1]:
            return max(floor, 0.05 * float(np.median(y)))
        mean, _ = self._posterior(X, y, floor)
        resid = y - X @ mean
        return max(floor, float(np.sqrt(np.mean(resid ** 2))))

    def _loo(self, X: np.ndarray, y: np.ndarray, noise: float) -> float | None:
        if len(y) < 2:
            return None
        errors = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            mean, _ = self._posterior(X[keep], y[keep], noise)
            errors.append(abs(float(X[i] @ mean) - y[i]) / y[i])
        return float(np.median(errors))
