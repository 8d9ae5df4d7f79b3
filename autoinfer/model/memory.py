"""How much device memory (or, on a CPU-only build, RAM) a configuration needs at its peak.

The memory model adds what a configuration puts in device memory: weights (byte accounting from
autoinfer.model.placement), KV cache and recurrent state for the context, compute buffers that grow with ubatch
(larger where the last layer's experts sit in RAM outside the driver's pinned buffers, `--no-host`), and the
staging copy of host-resident experts that op offload makes during prompt processing. It starts from these
physical estimates and is calibrated online (Bayesian linear regression) from the peaks measured by finished
trials, so its error shrinks as the campaign runs and is always reported. On several GPUs it predicts each GPU's
peak (a per-GPU budget binds on the fullest one): the same terms per device, with the layers cut by the tensor
split as llama.cpp cuts them, and one calibration fitted to every GPU's measured peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Sequence

import numpy as np

from autoinfer.model.placement import (
    device_bytes,
    first_gpu_layer,
    layer_devices,
    layers_on_cpu,
    ncmoe_patterns,
    placement_bytes,
    realize,
    split_shares,
)
from autoinfer.model.shape import ModelShape
from autoinfer.trial_config import TrialConfig

MIB = 1024 * 1024
OP_OFFLOAD_MIN_BATCH = 32  # GGML_OP_OFFLOAD_MIN_BATCH: from this ubatch on, host experts are copied to the GPU

# Bytes per element of the KV cache types (ggml block size 32 for the quantized ones).
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
            "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}

Side = Literal["device", "host"]
FEATURES = ("weights", "cache", "compute", "offload_copy", "overhead")


def served_context(config: TrialConfig) -> int:
    """The context a configuration's memory is counted at: every slot's `ctx_size` where it is set (llama-server's
    -c; a campaign's serve.context), else what llama-bench creates: the prompt, the generation and any depth."""
    measured = config.n_prompt + config.n_gen + int(config.get("n_depth", 0) or 0)
    ctx = config.get("ctx_size")
    return max(measured, int(ctx) * int(config.get("parallel", 1) or 1)) if ctx else measured


def measured_context(config: TrialConfig) -> TrialConfig:
    """`config` as an engine without a context knob (llama-bench) measures it: without `ctx_size`."""
    return config.with_(extra=tuple((k, v) for k, v in config.extra if k != "ctx_size"))


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
               config.ubatch, config.batch, config.type_k, config.type_v, config.flash_attn, served_context(config),
               shares, config.host_weights_unpinned())
        return self._features(key)

    def _compute_features(self, key: tuple[Any, ...]) -> np.ndarray:
        ngl, ncmoe, overrides, ubatch, batch, type_k, type_v, flash_attn, n_ctx, shares, unpinned = key
        s = self.shape
        gpu = self.side == "device"
        n_ctx = 256 * math.ceil(max(n_ctx, 1) / 256)  # llama_context pads the context to 256
        kv_per_token = s.n_head_kv * (s.key_length * KV_BYTES.get(type_k, 2.0) + s.value_length * KV_BYTES.get(type_v, 2.0))
        ub = max(1, min(ubatch, batch))
        # flash attention keeps no scores matrix; "auto" turns it on wherever the attention layer's device runs it
        # (llama_context::resolve_fused_ops), which the CPU and CUDA builds both do
        scores = 4 * s.n_head * n_ctx if flash_attn == "off" else 0
        # the attention mask, an input alive through the whole graph: over the context per token, f16 for flash
        # attention, else f32 (build_attn_inp_kq_mask): 32 MiB at a 32768-token context and ubatch 512
        scores += n_ctx * (2 if flash_attn != "off" else 4)
        per_token = 4 * (s.n_experts + 8 * s.hidden + 3 * s.n_experts_used * s.expert_ff)
        # llama.cpp's graph allocator reuses a tensor's buffer once it is consumed, so the compute buffer holds the
        # largest set alive at once: on the output's device the logits beside the last hidden state. Summed with the
        # layers' tensors it put ubatch 512 → 256 at 271 MiB on the 35B stand-in where an H100 freed 228-242
        # (benchmarks/results/vs-fit-h100.md).
        output = max(per_token, 4 * (s.vocab + s.hidden))
        offload_copy = 0.0
        cpu_layers = layers_on_cpu([*overrides, *ncmoe_patterns(ncmoe)], s.tensor_names) if gpu else set()
        if ub >= OP_OFFLOAD_MIN_BATCH:
            per_layer = {}
            for t in s.tensors:
                if t.group == "routed_experts" and t.layer in cpu_layers:
                    per_layer[t.layer] = max(per_layer.get(t.layer, 0), t.n_bytes)
            offload_copy = max(per_layer.values(), default=0)
        # With the weights in RAM outside the driver's pinned buffers (`--no-host`) and the last layer's experts
        # among them, the compute buffer held one more layer's per-token tensors beside the output's: in 8 H100
        # sweeps of the 35B stand-in, 46-62 MiB at ubatch 512 and 17-31 at 256 over the same placement with mmap, and
        # nothing with the first or a spread of layers' experts in RAM (benchmarks/results/vs-fit-h100-*.json).
        beside_output = per_token if unpinned and s.n_layers - 1 in cpu_layers else 0.0

        def cache_of(layers: list[int]) -> float:
            n_attention = sum(1 for i in layers if i in s.attention_layers)
            return n_ctx * kv_per_token * n_attention + s.recurrent_state_bytes * (len(layers) - n_attention)

        if self.n_devices == 1:
            weights = placement_bytes(s, ngl, ncmoe, overrides, gpu=gpu)
            first_gpu = first_gpu_layer(ngl, s.n_layers)
            cache = cache_of([i for i in range(s.n_layers) if not gpu or i >= first_gpu])
            compute = ub * (output + beside_output + scores)
            return np.array([[weights.gpu_bytes if gpu else weights.cpu_bytes + weights.gpu_bytes,
                              cache, compute, offload_copy, MIB]]) / MIB
        devices = layer_devices(s.n_layers, ngl, shares)
        weights_k = device_bytes(s, ngl, ncmoe, overrides, shares)
        rows = []
        for k in range(len(shares)):
            cache = cache_of([i for i in range(s.n_layers) if devices[i] == k])
            compute = ub * ((output + beside_output if devices[s.n_layers] == k else per_token) + scores)
            rows.append([weights_k[k], cache, compute, offload_copy if k == 0 else 0.0, MIB])
        return np.array(rows) / MIB

    def context_growth(self, config: TrialConfig, measured: TrialConfig) -> float:
        """MiB that `config`'s context adds over `measured`'s (the same configuration at the context a measurement
        created) on the fullest device: its KV cache and attention scores at their size in bytes, which is how
        llama.cpp allocates them, not at a coefficient fitted to peaks whose contexts barely differ."""
        d = self.features(config) - self.features(measured)
        grown = d[:, FEATURES.index("cache")] + d[:, FEATURES.index("compute")]
        return max(float(grown.max()), 0.0)

    # -- prediction and calibration -------------------------------------------------------------------------
    def predict(self, config: TrialConfig) -> Prediction:
        rows = self.features(config)
        c = self.calibration
        mean, cov = np.array(c.mean), np.array(c.cov)
        means = rows @ mean
        x = _fullest(rows, mean)
        var = c.noise_mib ** 2 + float(x @ cov @ x)
        return Prediction(float(x @ mean), math.sqrt(var), {k: float(v) for k, v in zip(FEATURES[:-1], x[:-1])},
                          tuple(float(m) for m in means) if len(rows) > 1 else ())

    def difference(self, config: TrialConfig, other: TrialConfig) -> tuple[float, float]:
        """The predicted peak of `config` minus that of `other` (fullest GPU of each) and the standard deviation of
        that difference from the coefficients' uncertainty alone: a term the two share cancels, with its error."""
        c = self.calibration
        mean, cov = np.array(c.mean), np.array(c.cov)
        d = _fullest(self.features(config), mean) - _fullest(self.features(other), mean)
        return float(d @ mean), math.sqrt(max(float(d @ cov @ d), 0.0))

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
        # A configuration's peak repeats from process to process (VRAM to the MiB in 45 configurations of 3 processes
        # on an H200, RSS within 0.5 MiB), so the mean follows the peaks at the floor's noise and the doubt about the
        # model's form stays in the spread. Fitted at the wider noise, the mean stayed 10-33 MiB under the next peak
        # of 10 stored GPU sweeps after 1-5 peaks; at the floor, 3-6 (tests/model/test_memory_compute.py).
        floor = max(1.0, 0.01 * float(np.median(y)))  # 1 MiB or 1% of the peak
        mean, _ = self._posterior(X, y, floor)
        noise = self._noise(X, y, floor, mean)
        _, cov = self._posterior(X, y, noise)
        self.calibration = Calibration(tuple(mean), tuple(map(tuple, cov)), noise, len(obs), self._loo(X, y, floor))
        return self.calibration

    def _posterior(self, X: np.ndarray, y: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
        prior_precision = np.diag(1.0 / np.square(self.PRIOR_SCALE))
        precision = prior_precision + X.T @ X / noise ** 2
        cov = np.linalg.inv(precision)
        mean = cov @ (prior_precision @ self.prior_mean + X.T @ y / noise ** 2)
        return mean, cov

    @staticmethod
    def _noise(X: np.ndarray, y: np.ndarray, floor: float, mean: np.ndarray) -> float:
        """The predictions' noise: at least the floor (5% of the peak while there are too few trials to fit it);
        larger where the residuals of the mean fitted at the floor say so."""
        if len(y) <= X.shape[1]:
            return max(floor, 0.05 * float(np.median(y)))
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


def _fullest(rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """The feature row of the device with the largest predicted peak (the one a budget binds)."""
    return rows[int(np.argmax(rows @ mean))]
