"""Models of decode speed against where the weights live, compared on equal terms.

Every fit minimises squared error of log(tok/s) (relative error), so residual sums, AICc and hold-out errors are
comparable between model families. Parameter CIs come from refitting on trials resampled with replacement.
Hold-out error is per configuration: the trials of one configuration (its processes, its confirmation rounds) leave
the training folds together, so its own luck never helps predict it, and it is scored against their median, since
a model of a configuration cannot predict one process's luck.

- power law (the seed's form): tok/s = C·(M − x)^α, x = GB of weights in system RAM, M fitted (not fixed);
  parameters are reported as ln C, α, M.
- bandwidth (roofline): 1/tok/s = t0 + bytes_cpu/BW_cpu + bytes_gpu/BW_gpu, non-negative coefficients; AICc
  counts the terms the trials determine (2 when every trial reads the same total bytes).
- performance: the search's model (autoinfer.model.performance) fitted without its priors,
  1/tok/s = t0 + a·cpu_gb + b·cpu_gb/threads + c·gpu_gb + d·cpu_layers (whole layers left on the CPU); AICc counts
  only the terms the trials determine (the rank of the design).
- threads: 1/tok/s = a + b/threads + c·threads per placement (parallel work, plus a per-thread cost that makes
  more threads slower past √(b/c)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import optimize

from autoinfer.model import performance

BOOTSTRAP = 200
FOLDS = 5
M_GAP_MAX = 1e3  # largest M − max(x) searched, in units of the data's x range


@dataclass(frozen=True)
class Fit:
    """One fitted model: point estimates, bootstrap CIs, information criterion and hold-out error."""

    name: str
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    n: int
    k: int
    rss_log: float  # Σ (log y − log ŷ)²
    aicc: float
    holdout_mape: float  # percent, k-fold over configurations
    holdout_se: float  # its standard error over the held-out configurations, percent
    extra: dict[str, object] = field(default_factory=dict)
    boot: tuple[dict[str, float], ...] = field(default=(), repr=False)  # refits on resampled trials (for bands)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "params": self.params, "ci": {k: list(v) for k, v in self.ci.items()},
                "n": self.n, "k": self.k, "rss_log": self.rss_log, "aicc": self.aicc,
                "holdout_mape_pct": self.holdout_mape, "holdout_se_pct": self.holdout_se, **self.extra}


def aicc(rss: float, n: int, k: int) -> float:
    """Akaike's criterion with the small-sample correction, for Gaussian errors of log(tok/s)."""
    if n - k - 1 <= 0 or rss <= 0:
        return math.inf
    return n * math.log(rss / n) + 2 * k + 2 * k * (k + 1) / (n - k - 1)


# ---------------------------------------------------------------- power law

def _power_given_m(x: np.ndarray, logy: np.ndarray, m: float) -> tuple[float, float, float]:
    """OLS of log y on log(M − x) for a fixed M → (log C, α, rss)."""
    lx = np.log(m - x)
    a = np.vstack([np.ones_like(lx), lx]).T
    coef, *_ = np.linalg.lstsq(a, logy, rcond=None)
    rss = float(np.sum((logy - a @ coef) ** 2))
    return float(coef[0]), float(coef[1]), rss


def _power_fit(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """M profiled on a log scale above max(x): the gap M − max(x) spans 1e-3 to 1e3 times the data's range
    (beyond that the curve is an exponential in x and M stops being identifiable)."""
    logy = np.log(y)
    span = max(float(np.ptp(x)), 1e-9)
    top = float(np.max(x))

    def rss_of(log_gap: float) -> float:
        return _power_given_m(x, logy, top + span * math.exp(log_gap))[2]

    grid = np.linspace(math.log(1e-3), math.log(M_GAP_MAX), 60)
    start = grid[int(np.argmin([rss_of(g) for g in grid]))]
    best = optimize.minimize_scalar(rss_of, bounds=(max(grid[0], start - 0.5), min(grid[-1], start + 0.5)),
                                    method="bounded")
    m = top + span * math.exp(float(best.x))
    log_c, alpha, _ = _power_given_m(x, logy, m)
    return {"ln_C": log_c, "alpha": alpha, "M": m}


def power_law_predict(params: dict[str, float], x: np.ndarray) -> np.ndarray:
    """Evaluated in log space: with M far above the data, C underflows while ln C stays finite."""
    gap = np.clip(params["M"] - np.asarray(x, dtype=float), 1e-12, None)
    return np.exp(np.clip(params["ln_C"] + params["alpha"] * np.log(gap), -700, 700))


def alpha_versus_m(x: Sequence[float], y: Sequence[float], ms: Sequence[float]) -> list[dict[str, float]]:
    """α (and C, rss) with M held at each value: how much the exponent is a consequence of the chosen M."""
    xs, logy = np.asarray(x, float), np.log(np.asarray(y, float))
    out = []
    for m in ms:
        if m <= float(np.max(xs)):
            continue
        log_c, alpha, rss = _power_given_m(xs, logy, float(m))
        out.append({"M": float(m), "alpha": alpha, "ln_C": log_c, "rss_log": rss})
    return out


def power_law_two_point(x: tuple[float, float], y: tuple[float, float], m: float) -> dict[str, float]:
    """The seed's solve: α and C through exactly two points with M fixed."""
    alpha = math.log(y[1] / y[0]) / math.log((m - x[1]) / (m - x[0]))
    return {"alpha": alpha, "ln_C": math.log(y[0]) - alpha * math.log(m - x[0]), "M": m}


# ---------------------------------------------------------------- bandwidth

def _bandwidth_fit(features: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """NNLS on y·(t0 + a·cpu + b·gpu) ≈ 1, i.e. relative error of 1/tok/s, which is relative error of tok/s."""
    design = np.column_stack([np.ones(len(y)), features]) * y[:, None]
    coef, _ = optimize.nnls(design, np.ones(len(y)))
    t0, a, b = (float(c) for c in coef)
    return {"t0_s": t0, "BW_cpu_GBps": 1 / a if a > 0 else math.inf, "BW_gpu_GBps": 1 / b if b > 0 else math.inf}


def bandwidth_predict(params: dict[str, float], features: np.ndarray) -> np.ndarray:
    f = np.asarray(features, dtype=float)
    per_token = params["t0_s"] + f[:, 0] / params["BW_cpu_GBps"] + f[:, 1] / params["BW_gpu_GBps"]
    return 1.0 / np.clip(per_token, 1e-12, None)


# ---------------------------------------------------------------- threads

def _threads_fit(t: np.ndarray, y: np.ndarray) -> dict[str, float]:
    t = t.reshape(-1)
    design = np.column_stack([np.ones_like(t), 1.0 / t, t]) * y[:, None]
    coef, _ = optimize.nnls(design, np.ones(len(y)))
    a, b, c = (float(v) for v in coef)
    return {"a_s": a, "b_s": b, "c_s": c, "t_opt": math.sqrt(b / c) if c > 0 else math.inf}


def threads_predict(params: dict[str, float], t: np.ndarray) -> np.ndarray:
    t = np.asarray(t, dtype=float).reshape(-1)
    return 1.0 / np.clip(params["a_s"] + params["b_s"] / t + params["c_s"] * t, 1e-12, None)


# ---------------------------------------------------------------- shared machinery

def _evaluate(name: str, fit: Callable[[np.ndarray, np.ndarray], dict[str, float]],
              predict: Callable[[dict[str, float], np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray,
              k: int, seed: int, groups: np.ndarray | None, extra: dict[str, object] | None = None) -> Fit:
    n = len(y)
    params = fit(x, y)
    resid = np.log(y) - np.log(predict(params, x))
    rss = float(np.sum(resid**2))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, n, n)
        if len(np.unique(x[idx], axis=0)) < k:
            continue
        boots.append(fit(x[idx], y[idx]))
    ci = {}
    for key in params:
        values = np.array([b[key] for b in boots], dtype=float)
        values = values[np.isfinite(values)]
        ci[key] = (float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))) if values.size else (
            math.nan, math.nan)
    return Fit(name, params, ci, n, k, rss, aicc(rss, n, k), *holdout_error(fit, predict, x, y, seed=seed,
                                                                         groups=groups),
               extra or {}, tuple(boots))


def holdout_error(fit: Callable[[np.ndarray, np.ndarray], dict[str, float]],
                  predict: Callable[[dict[str, float], np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray,
                  folds: int = FOLDS, seed: int = 0, groups: np.ndarray | None = None) -> tuple[float, float]:
    """Mean absolute percentage error on held-out configurations, k-fold (k = min(folds, configurations)), and its
    standard error. `groups` names each trial's configuration (default: every trial its own); a configuration's
    trials are held out together and scored by their median against the prediction's."""
    groups = np.arange(len(y)) if groups is None else np.asarray(groups)
    _, first = np.unique(groups, return_index=True)
    labels = groups[np.sort(first)]  # in order of first appearance: one trial each keeps the trials' order
    folds = min(folds, len(labels))
    if folds < 2:
        return math.nan, math.nan
    order = np.random.default_rng(seed).permutation(len(labels))
    errors = []
    for part in np.array_split(order, folds):
        held = np.isin(groups, labels[part])
        try:
            params = fit(x[~held], y[~held])
        except (ValueError, np.linalg.LinAlgError):
            return math.nan, math.nan
        predicted = predict(params, x[held])
        for label in labels[part]:
            own = groups[held] == label
            measured = float(np.median(y[held][own]))
            errors.append(abs(float(np.median(predicted[own])) - measured) / measured)
    return float(100 * np.mean(errors)), float(100 * np.std(errors, ddof=1) / math.sqrt(len(errors)))


def _determined_terms(design: np.ndarray) -> int:
    """How many of a linear model's terms the rows determine: the rank of the design with its columns scaled to
    unit length (an all-zero column determines nothing)."""
    norms = np.linalg.norm(design, axis=0)
    return int(np.linalg.matrix_rank(design[:, norms > 0] / norms[norms > 0], tol=1e-6))


def _clean(y: Sequence[float], *cols: Sequence[float],
           groups: Sequence[object] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The trials with a positive speed and every feature finite: features, speeds and their configurations."""
    arrays = [np.asarray(c, dtype=float) for c in cols]
    yy = np.asarray(y, dtype=float)
    keep = np.isfinite(yy) & (yy > 0)
    for a in arrays:
        keep &= np.isfinite(a)
    x = np.column_stack([a[keep] for a in arrays])
    return (x[:, 0] if x.shape[1] == 1 else x), yy[keep], None if groups is None else np.asarray(groups)[keep]


def fit_power_law(cpu_gb: Sequence[float], tok_s: Sequence[float], seed: int = 0,
                  groups: Sequence[object] | None = None) -> Fit:
    x, y, g = _clean(tok_s, cpu_gb, groups=groups)
    if len(np.unique(x)) < 3:
        raise ValueError("the power law needs at least 3 distinct GB-in-RAM values")
    ms = np.max(x) + np.ptp(x) * np.array([0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8])
    fit = _evaluate("power_law", _power_fit, power_law_predict, x, y, 3, seed, g,
                    {"alpha_vs_M": alpha_versus_m(x, y, ms)})
    # α and M trade off; the slope of ln(tok/s) per GB at the data's centre is what the data pins down.
    centre = float(np.mean(x))
    slopes = np.array([-b["alpha"] / (b["M"] - centre) for b in fit.boot])
    fit.extra.update({
        "log_slope_per_gb": -fit.params["alpha"] / (fit.params["M"] - centre),
        "log_slope_per_gb_ci": [float(np.percentile(slopes, 2.5)), float(np.percentile(slopes, 97.5))],
        "at_gb": centre,
        "M_at_search_bound": bool(fit.params["M"] - np.max(x) >= 0.99 * M_GAP_MAX * np.ptp(x)),
    })
    return fit


def fit_bandwidth(active_cpu_gb: Sequence[float], active_gpu_gb: Sequence[float], tok_s: Sequence[float],
                  seed: int = 0, groups: Sequence[object] | None = None) -> Fit:
    """`identifiable` is False when every trial reads the same total bytes per token (one model file): then only
    t0 + total/BW_gpu is determined, and t0 and BW_gpu trade off against each other."""
    x, y, g = _clean(tok_s, active_cpu_gb, active_gpu_gb, groups=groups)
    if len(y) < 4:
        raise ValueError("the bandwidth model needs at least 4 trials with byte accounting")
    rank = _determined_terms(np.column_stack([np.ones(len(y)), x]))
    if rank < 2:
        raise ValueError("every trial reads the same bytes per token on each side (no placement varies): "
                         "nothing for the bandwidth model to explain")
    fit = _evaluate("bandwidth", _bandwidth_fit, bandwidth_predict, x, y, rank, seed, g, {"identifiable": rank == 3})
    # Moving one GB from GPU to CPU costs 1/BW_cpu − 1/BW_gpu seconds per token: determined even when t0 and
    # BW_gpu are not, and the bandwidth the CPU side effectively adds.
    marginal = np.array([_marginal(b) for b in fit.boot])
    marginal = marginal[np.isfinite(marginal)]
    fit.extra.update({"cpu_marginal_GBps": _marginal(fit.params),
                      "cpu_marginal_GBps_ci": [float(np.percentile(marginal, 2.5)),
                                               float(np.percentile(marginal, 97.5))] if marginal.size else None})
    return fit


def fit_performance(active_cpu_gb: Sequence[float], active_gpu_gb: Sequence[float], cpu_layers: Sequence[float],
                    threads: Sequence[float], tok_s: Sequence[float], seed: int = 0,
                    groups: Sequence[object] | None = None) -> Fit:
    """The search's performance model on the trials; `terms_determined` is how many of its terms they pin down."""
    x, y, g = _clean(tok_s, active_cpu_gb, active_gpu_gb, cpu_layers, threads, groups=groups)
    rank = _determined_terms(_performance_rows(x))
    if len(y) < rank + 2:
        raise ValueError(f"the performance model needs at least {rank + 2} trials with byte accounting")
    return _evaluate("performance", _performance_fit, performance_predict, x, y, rank, seed, g,
                     {"terms_determined": rank})


def _performance_rows(x: np.ndarray) -> np.ndarray:
    return np.array([performance.Features(cpu, gpu, 0.0, int(layers), threads, 1.0).tg_row()
                     for cpu, gpu, layers, threads in np.atleast_2d(x)])


def _performance_fit(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return dict(zip(performance.TG_TERMS, (float(c) for c in performance.fit(_performance_rows(x), y))))


def performance_predict(params: dict[str, float], x: np.ndarray) -> np.ndarray:
    return performance.predict(np.array([params[t] for t in performance.TG_TERMS]), _performance_rows(x))


def _marginal(params: dict[str, float]) -> float:
    cost = 1 / params["BW_cpu_GBps"] - 1 / params["BW_gpu_GBps"]
    return 1 / cost if cost > 0 else math.inf


def fit_threads(threads: Sequence[float], tok_s: Sequence[float], seed: int = 0,
                groups: Sequence[object] | None = None) -> Fit:
    """One placement's thread scaling; `slower_above` is the thread count past which the model says speed drops."""
    x, y, g = _clean(tok_s, threads, groups=groups)
    if len(np.unique(x)) < 3:
        raise ValueError("the threads model needs at least 3 distinct thread counts")
    fit = _evaluate("threads", _threads_fit, threads_predict, x, y, 3, seed, g)
    t_opt = fit.params["t_opt"]
    measured_max = float(np.max(x))
    by_t = {float(t): float(np.median(y[x == t])) for t in np.unique(x)}
    best_t = max(by_t, key=by_t.get)
    slower = bool(math.isfinite(t_opt) and t_opt < measured_max and by_t[measured_max] < by_t[best_t])
    fit.extra.update({"best_threads_measured": best_t, "more_threads_slower": slower,
                      "median_by_threads": {str(int(t)): v for t, v in sorted(by_t.items())}})
    return fit


def band(fit: Fit, predict: Callable[[dict[str, float], np.ndarray], np.ndarray], x: np.ndarray,
         level: float = 95.0) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise percentile band of the bootstrap refits' predictions at x."""
    preds = np.array([predict(b, x) for b in fit.boot])
    tail = (100 - level) / 2
    return np.percentile(preds, tail, axis=0), np.percentile(preds, 100 - tail, axis=0)


def winner(fits: Sequence[Fit]) -> dict[str, str | None]:
    """The family that wins by AICc and by hold-out error (None when nothing was fitted). By hold-out error the
    one-standard-error rule decides: the model with the fewest determined terms whose error is within one standard
    error of the lowest, so a model that nests another does not win on noise."""
    finite = [f for f in fits if math.isfinite(f.aicc)]
    holdout = [f for f in fits if math.isfinite(f.holdout_mape)]
    by_holdout = None
    if holdout:
        best = min(holdout, key=lambda f: f.holdout_mape)
        close = [f for f in holdout if f.holdout_mape <= best.holdout_mape + best.holdout_se]
        by_holdout = min(close, key=lambda f: (f.k, f.holdout_mape)).name
    return {"by_aicc": min(finite, key=lambda f: f.aicc).name if finite else None, "by_holdout": by_holdout}
