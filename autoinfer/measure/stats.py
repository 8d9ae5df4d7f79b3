"""Statistics that keep noise from crowning a winner.

llama-bench's own spread is up to 10% for generation and 10-25% for prompt processing, and the same
configuration moves ±20% between processes (shared/notes/anchors.md). So a score is a median of repetitions
with a bootstrap confidence interval, and two configurations only "differ" when a rank test (or Welch's t-test)
says so on samples measured side by side.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

TESTS = ("mannwhitney", "welch")


def _values(samples: Sequence[float], what: str, minimum: int) -> np.ndarray:
    arr = np.asarray([float(s) for s in samples], dtype=float)
    if arr.size < minimum:
        raise ValueError(f"{what} needs at least {minimum} samples, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} needs finite samples, got {arr.tolist()}")
    return arr


def _axis_median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis)


def bootstrap_ci(
    samples: Sequence[float],
    *,
    confidence: float = 0.95,
    stat: Callable[..., np.ndarray] = _axis_median,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` (default: the median) over `samples`.

    Percentile rather than BCa: BCa's jackknife acceleration is undefined for the median of the handful of
    repetitions a trial has, and scipy then returns NaN. `stat` must accept an `axis` keyword (numpy style).
    A seeded generator makes the interval reproducible from the stored samples.
    """
    arr = _values(samples, "bootstrap_ci", 2)
    if np.all(arr == arr[0]):
        return float(arr[0]), float(arr[0])
    res = sps.bootstrap(
        (arr,),
        stat,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample standard deviation over mean (0.1 = 10% spread)."""
    arr = _values(samples, "cv", 2)
    mean = float(arr.mean())
    if mean == 0.0:
        raise ValueError("cv is undefined for samples whose mean is 0")
    return float(arr.std(ddof=1)) / abs(mean)


@dataclass(frozen=True)
class Comparison:
    """Whether samples `a` and `b` come from different distributions, and by how much a is faster.

    `ratio` is median(a) / median(b) and `ratio_ci` its bootstrap interval, both samples resampled independently
    (`compare`); or, for samples paired by round, the geometric mean of a[i] / b[i] and its t interval
    (`compare_paired`).
    """

    p_value: float
    differ: bool
    test: str
    ratio_ci: tuple[float, float]
    ratio: float

    def to_dict(self) -> dict[str, object]:
        return {
            "p_value": self.p_value,
            "differ": self.differ,
            "test": self.test,
            "ratio": self.ratio,
            "ratio_ci": list(self.ratio_ci),
        }


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    alpha: float = 0.05,
    test: str = "mannwhitney",
    seed: int = 0,
) -> Comparison:
    """Two-sided test of a vs b at level `alpha`.

    Mann-Whitney U (default) assumes nothing about the shape of the noise, which has outliers (a background job,
    a cold page cache). With n samples each its smallest possible p-value is 2/C(2n, n): 0.1 for n=3, 0.008 for
    n=5, so fewer than 4 rounds per side can never show a difference at alpha=0.05 — that is a tie, honestly.
    """
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}: use one of {', '.join(TESTS)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    xa = _values(a, "compare", 2)
    xb = _values(b, "compare", 2)
    constant = bool(np.all(xa == xa[0]) and np.all(xb == xb[0]))
    if constant and xa[0] == xb[0]:
        p = 1.0
    elif constant and test == "welch":  # no spread on either side: Welch's t is infinite
        p = 0.0
    elif test == "mannwhitney":
        # scipy's exact distribution assumes no ties and otherwise falls back to a normal approximation that is
        # far too bold for a handful of runs; a permutation distribution stays exact with ties.
        tied = np.unique(np.concatenate([xa, xb])).size < xa.size + xb.size
        method = sps.PermutationMethod(rng=np.random.default_rng(seed)) if tied else "auto"
        p = float(sps.mannwhitneyu(xa, xb, alternative="two-sided", method=method).pvalue)
    else:
        p = float(sps.ttest_ind(xa, xb, equal_var=False).pvalue)
    ratio = float(np.median(xa) / np.median(xb))
    if constant:
        ratio_ci = (ratio, ratio)
    else:
        res = sps.bootstrap(
            (xa, xb),
            _median_ratio,
            n_resamples=2000,
            method="percentile",
            vectorized=True,
            paired=False,
            rng=np.random.default_rng(seed),
        )
        ratio_ci = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    return Comparison(p_value=p, differ=p < alpha, test=test, ratio_ci=ratio_ci, ratio=ratio)


def compare_paired(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05) -> Comparison:
    """a against b run in rounds, a[i] beside b[i]: the geometric mean of the per-round ratios, its (1 - alpha) t
    interval and the paired t-test's two-sided p on the log ratios (the interval excludes 1 exactly when p < alpha).

    Interleaving puts both sides of a round under the same load, so a drift that moves every process of a run
    (one vs-fit run rose 17% from its first round to its last) cancels in the round's ratio and not between two
    medians taken from different rounds. Logs make a/b and b/a mirror images. A t interval rather than a bootstrap
    or a rank test: with 5 rounds a percentile bootstrap of the mean never reaches past the observed ratios (five
    ratios above 1 always exclude 1), and Wilcoxon's signed-rank test cannot give p below 0.0625.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    xa = _values(a, "compare_paired", 2)
    xb = _values(b, "compare_paired", 2)
    if xa.size != xb.size:
        raise ValueError(f"compare_paired needs one b per a (rounds), got {xa.size} and {xb.size}")
    if np.any(xa <= 0) or np.any(xb <= 0):
        raise ValueError("compare_paired needs positive samples: it compares their ratios")
    d = np.log(xa) - np.log(xb)
    ratio = float(np.exp(d.mean()))
    if np.ptp(d) < 1e-12:  # the same ratio every round (to rounding): no spread to test against
        p = 1.0 if abs(d[0]) < 1e-12 else 0.0
        ratio_ci = (ratio, ratio)
    else:
        half = float(sps.t.ppf(1 - alpha / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
        p = float(sps.ttest_1samp(d, 0.0).pvalue)
        ratio_ci = (float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half)))
    return Comparison(p_value=p, differ=p < alpha, test="paired-t", ratio_ci=ratio_ci, ratio=ratio)


def smallest_p(n: int, m: int, test: str) -> float:
    """The smallest two-sided p-value `test` can give n runs against m: 2/C(n+m, n) for Mann-Whitney's exact
    distribution (0.1 for 3 against 3, so such a comparison can never reject at 0.05), none for Welch's t."""
    return 2 / math.comb(n + m, n) if test == "mannwhitney" else 0.0


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm-Bonferroni: which of several p-values reject at family-wise level `alpha`.

    The confirmation compares the leader with every other finalist; without a correction, more finalists would
    mean more chances to call noise a difference.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    reject = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] >= alpha / (m - rank):
            break
        reject[i] = True
    return reject


@dataclass(frozen=True)
class SampleSummary:
    """Median, bootstrap interval and spread of one trial's repetitions; None where too few samples."""

    n: int
    median: float | None
    ci_low: float | None
    ci_high: float | None
    cv: float | None

    def to_dict(self) -> dict[str, object]:
        return {"n": self.n, "median": self.median, "ci": [self.ci_low, self.ci_high], "cv": self.cv}


def summarize(samples: Sequence[float], *, confidence: float = 0.95, seed: int = 0) -> SampleSummary:
    """Summary of repetitions. One sample has a median but no interval or spread."""
    values = [float(s) for s in samples]
    if not values:
        return SampleSummary(0, None, None, None, None)
    med = statistics.median(values)
    if len(values) < 2:
        return SampleSummary(1, med, None, None, None)
    low, high = bootstrap_ci(values, confidence=confidence, seed=seed)
    spread = cv(values) if statistics.fmean(values) > 0 else None
    return SampleSummary(len(values), med, low, high, spread)
