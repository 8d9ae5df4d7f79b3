"""One model of speed for the search and the analysis: tg and pp from where the weights live, threads and ubatch.

Decode reads every active weight once per token, so seconds per token are a sum of bytes over bandwidths:

    1/tg = t0 + a·cpu_gb + b·cpu_gb/threads + e·cpu_gb·threads + c·gpu_gb + d·cpu_layers

with `cpu_gb`/`gpu_gb` the weights one token reads on each side, `cpu_layers` the repeating layers kept whole on
the CPU (their attention and recurrent state also run there, which bytes alone do not capture), and two threads
terms for the CPU-side work: it splits over the threads (b/threads), and every thread adds synchronisation and
contention (e·threads: each op ends in a barrier all threads must reach; on a host with fewer free cores than
threads, a descheduled thread stalls the others). Together the work per GB costs a + b/T + e·T, fastest at
T = sqrt(b/e), slower past it (cpu-tiny.csv: two threads 10-40× slower than one on a loaded two-core host).
Prompt processing copies host-resident weights to the GPU once per ubatch (op offload) and computes the rest per
token:

    1/pp = p0 + q·cpu_total_gb/ubatch + r·cpu_gb/threads + v·cpu_gb·threads + s·gpu_gb + u·cpu_layers

All coefficients are non-negative and fitted by NNLS on relative error (y·ŷ⁻¹ ≈ 1, the bandwidth fit's loss), so
a fit never says that more weights on the CPU is faster. The search starts from physical priors (PCIe- and
DRAM-class bandwidths) and pulls the coefficients towards them with a ridge term, so a few trials refine them
instead of replacing them (`fit(..., prior=...)`); the analysis fits without a prior and reports hold-out error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import optimize

from autoinfer.model.placement import cpu_layers, placement_bytes, realize
from autoinfer.model.shape import ModelShape
from autoinfer.trial_config import TrialConfig

GB = 1e9
DEFAULT_THREADS = 8  # llama.cpp uses the physical cores; a configuration that does not say gets this in the features
TG_TERMS = ("t0_s", "cpu_s_per_gb", "cpu_thread_s_per_gb", "cpu_sync_s_per_gb_thread", "gpu_s_per_gb", "cpu_layer_s")
PP_TERMS = ("p0_s", "copy_s_per_gb_ubatch", "cpu_thread_s_per_gb", "cpu_sync_s_per_gb_thread", "gpu_s_per_gb",
            "cpu_layer_s")
# Priors (seconds): ~250 tok/s with everything on a datacentre GPU, ~40 GB/s of DRAM for CPU-side experts, a whole
# layer on the CPU costs about a millisecond per token (benchmarks/results anchors); prompt: ~10k tok/s on the GPU,
# ~25 GB/s of PCIe per ubatch copy. The synchronisation prior puts the best thread count at 16 (sqrt(b/e)), a
# server's physical cores.
SYNC_OPTIMUM_THREADS = 16
TG_PRIOR = (1 / 250, 1 / 40, 1 / 80, 1 / 80 / SYNC_OPTIMUM_THREADS ** 2, 1 / 3000, 1e-3)
PP_PRIOR = (1 / 10000, 1 / 25, 1 / 4000, 1 / 4000 / SYNC_OPTIMUM_THREADS ** 2, 1 / 50000, 2e-5)


@dataclass(frozen=True)
class Features:
    """What the model reads from a configuration (GB of weights one token touches on each side, …)."""

    cpu_gb: float
    gpu_gb: float
    cpu_total_gb: float
    cpu_layers: int
    threads: float
    ubatch: float

    def tg_row(self) -> np.ndarray:
        return np.array([1.0, self.cpu_gb, self.cpu_gb / self.threads, self.cpu_gb * self.threads, self.gpu_gb,
                         self.cpu_layers])

    def pp_row(self) -> np.ndarray:
        return np.array([1.0, self.cpu_total_gb / self.ubatch, self.cpu_gb / self.threads,
                         self.cpu_gb * self.threads, self.gpu_gb, self.cpu_layers])


def features_of(shape: ModelShape, config: TrialConfig, gpu: bool = True) -> Features:
    """The model's features of one configuration (placement parameters realised into overrides first)."""
    real = realize(config, shape.n_layers)
    return _features(shape, _placement(shape, real.n_gpu_layers, real.n_cpu_moe, real.override_tensors, gpu), config)


def _placement(shape: ModelShape, ngl: int, ncmoe: int, overrides: tuple[str, ...], gpu: bool) -> tuple[float, ...]:
    pb = placement_bytes(shape, ngl, ncmoe, overrides, gpu=gpu)
    return pb.active_cpu_gb, pb.active_gpu_gb, pb.cpu_gb, cpu_layers(ngl, shape.n_layers, gpu)


def _features(shape: ModelShape, placed: tuple[float, ...], config: TrialConfig) -> Features:
    cpu_gb, gpu_gb, cpu_total_gb, whole = placed
    return Features(cpu_gb, gpu_gb, cpu_total_gb, int(whole), float(config.threads or DEFAULT_THREADS),
                    float(max(1, min(config.ubatch, config.batch))))


def fit(rows: np.ndarray, y: Sequence[float], prior: Sequence[float] | None = None,
        strength: float = 1.0) -> np.ndarray:
    """Non-negative coefficients with y·(rows·θ) ≈ 1; with a prior, each coefficient is pulled towards it (relative
    deviation weighted by `strength`, i.e. worth that many trials' relative error)."""
    rows = np.asarray(rows, dtype=float)
    y = np.asarray(y, dtype=float)
    design = rows * y[:, None]
    target = np.ones(len(y))
    if prior is not None:
        p = np.asarray(prior, dtype=float)
        design = np.vstack([design, np.diag(math.sqrt(strength) / p)])
        target = np.concatenate([target, np.full(len(p), math.sqrt(strength))])
    coef, _ = optimize.nnls(design, target)
    return coef


def predict(coef: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """tok/s for each row of features."""
    return 1.0 / np.clip(np.asarray(rows, dtype=float) @ coef, 1e-12, None)


@dataclass
class PerformanceModel:
    """tg and pp of configurations of one model, from the priors refined by the trials measured so far."""

    shape: ModelShape
    gpu: bool = True
    tg_coef: np.ndarray = None  # type: ignore[assignment]
    pp_coef: np.ndarray = None  # type: ignore[assignment]
    n: int = 0

    def __post_init__(self) -> None:
        self.tg_coef = np.array(TG_PRIOR, dtype=float)
        self.pp_coef = np.array(PP_PRIOR, dtype=float)
        self._placed: dict[tuple[Any, ...], tuple[float, ...]] = {}  # byte accounting per placement (it is slow)

    def features(self, config: TrialConfig) -> Features:
        real = realize(config, self.shape.n_layers)
        key = (real.n_gpu_layers, real.n_cpu_moe, real.override_tensors)
        if key not in self._placed:
            self._placed[key] = _placement(self.shape, *key, self.gpu)
        return _features(self.shape, self._placed[key], config)

    def calibrate(self, observations: Sequence[tuple[TrialConfig, float | None, float | None]]) -> None:
        """Refit to (configuration, tg median, pp median) of measured trials, towards the priors."""
        feats = [(self.features(config), tg, pp) for config, tg, pp in observations]
        for kind, prior in (("tg", TG_PRIOR), ("pp", PP_PRIOR)):
            data = [(f.tg_row() if kind == "tg" else f.pp_row(), tg if kind == "tg" else pp) for f, tg, pp in feats]
            data = [(row, v) for row, v in data if v is not None and v > 0]
            if data:
                setattr(self, f"{kind}_coef", fit(np.array([r for r, _ in data]), [v for _, v in data], prior))
        self.n = len(observations)

    def predict(self, config: TrialConfig) -> tuple[float, float]:
        """(tg, pp) in tok/s."""
        f = self.features(config)
        return float(predict(self.tg_coef, f.tg_row()[None])[0]), float(predict(self.pp_coef, f.pp_row()[None])[0])

    def score(self, config: TrialConfig, weights: dict[str, float]) -> float:
        """The campaign's objective (weighted geometric mean of tg and pp), predicted."""
        tg, pp = self.predict(config)
        total = sum(w * math.log(tg if kind == "tg" else pp) for kind, w in weights.items() if kind in ("tg", "pp"))
        return math.exp(total)
