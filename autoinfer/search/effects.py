"""What the knobs the performance model does not see do to speed, learned from every trial, with its uncertainty.

The performance model predicts a configuration's speed from where its weights live (and threads, ubatch); the
other knobs (KV types, flash attention, load mode, placement pattern, … and what the performance model gets wrong
about threads and ubatch) multiply it. Each knob value gets a log-multiplier and each pair of values of two knobs
another (knobs can help alone and hurt together), a Bayesian ridge regression of log(measured / performance-model)
on one-hot values and value pairs:

    log y_i − log perf_i = c + Σ_k β[k, v_k] + Σ_{k<l} γ[k, v_k, l, v_l] + ε_i,
    β ~ N(0, τ_k² R_k),  γ ~ N(0, INTERACTION_SD²),  ε_i ~ N(0, σ_i² + RESIDUAL_SD²)

τ_k is PRIOR_SD, or more where knob k's measured values differ by more. R_k is the identity for an unordered knob;
for a numeric one with more than two values (threads, ubatch, …) it is a trend across the values by rank plus steps
around it, values n ranks apart correlating by NEIGHBOUR_CORRELATION^n (_ordered_prior): speed moves with such a knob
by steps, so a value next to one measured fast is expected to be fast too, not typical, and a trend measured over
three values goes on to the next (two values have no trend to carry). With independent values, a trend (16 threads
slower than 12, 8 faster) said nothing about 4: it kept a typical value's prediction, below the incumbent's, and was
not measured (synthetic-252 at 12 GiB, benchmarks/results/search-efficiency.md); with correlated steps only, 4 was
expected to fall back halfway to the mean, still below 8 (synthetic-388 at 8 GiB).

σ_i² is the variance of trial i's pooled median (from its repetitions' spread); RESIDUAL_SD what neither explains,
mostly how far one process lands from another of the same configuration (measured, below).
The pairs' prior is small: on the measured H100 tables, pairs of knobs explain no more of the speeds than noise
does (benchmarks/table_structure.py), so an interaction must be measured before the model believes it. The search
compares a candidate with the incumbent by the difference of their predictions: its mean and standard deviation
say both how much better the model expects it and how little the trials have told about the values it changes (a
value or pair never measured keeps the prior's spread). Every trial informs every estimate: a move measured from
an earlier incumbent need not be measured again from the next one.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np

PRIOR_SD = 0.05  # a knob value's effect before any trial: a few percent, rarely more than ten
INTERACTION_SD = 0.02  # what two knobs' values do together beyond the sum of their effects, before any trial
# What neither explains: three knobs together, and a process's own luck, which its repetitions do not show. One
# configuration run in 5 fresh processes on an H100 scattered by a log SD of 0.03-0.10 (median 0.07; 6
# configurations, benchmarks/results/vs-fit-h100.json), where the repetitions inside each run agreed within ~1%.
RESIDUAL_SD = 0.07
# The performance model's own error at the boundary, or the whole log speed where there is no performance model:
# unknown, a prior broad enough that the level of the speeds goes here and not into the values first measured.
INTERCEPT_SD = 10.0
NEIGHBOUR_CORRELATION = 0.5  # prior correlation of adjacent steps of an ordered knob around its trend
TREND_SHARE = 0.5  # of an ordered knob's prior variance, the part that is a trend across its values (_ordered_prior)
MAX_COLUMNS = 1000  # values and value pairs; beyond this the model keeps single values only


class KnobEffects:
    """Posterior of the knob-value effects from observations (knob values, log residual, variance)."""

    def __init__(self, values: dict[str, Sequence[Any]]) -> None:
        singles = [((knob, _key(v)),) for knob, vs in values.items() for v in vs]
        pairs = [((a, _key(va)), (b, _key(vb))) for a, b in itertools.combinations(values, 2)
                 for va in values[a] for vb in values[b]]
        if len(singles) + len(pairs) > MAX_COLUMNS:  # a space too large to learn pairs in a few trials
            pairs = []
        self.index = {column: i + 1 for i, column in enumerate(singles + pairs)}  # 0: the intercept
        self.knob_columns = {knob: [self.index[((knob, _key(v)),)] for v in vs] for knob, vs in values.items()}
        self.prior_sd = np.array([INTERCEPT_SD] + [PRIOR_SD] * len(singles) + [INTERACTION_SD] * len(pairs))
        shape = np.eye(len(self.prior_sd))
        self.prior_shape_inv = np.eye(len(self.prior_sd))  # block by block: the rest of the matrix is the identity
        for knob, vs in values.items():
            if len(vs) > 2 and numeric(vs):
                ranked = np.array([self.index[((knob, _key(v)),)] for v in sorted(vs)])
                block = _ordered_prior(len(ranked))
                shape[np.ix_(ranked, ranked)] = block
                self.prior_shape_inv[np.ix_(ranked, ranked)] = np.linalg.inv(block)
        self.mean = np.zeros(len(self.prior_sd))
        self.cov = shape * np.outer(self.prior_sd, self.prior_sd)
        self.n = 0

    def row(self, knobs: dict[str, Any]) -> np.ndarray:
        x = np.zeros(len(self.index) + 1)
        x[0] = 1.0
        values = sorted((knob, _key(v)) for knob, v in knobs.items())
        for column in [(kv,) for kv in values] + list(itertools.combinations(values, 2)):
            i = self.index.get(column) or self.index.get(column[::-1])
            if i is not None:
                x[i] = 1.0
        return x

    def fit(self, observations: Sequence[tuple[dict[str, Any], float, float]]) -> "KnobEffects":
        """Condition the prior on (knob values, log(measured / predicted), variance of that log) per configuration.
        A knob whose measured values differ by more than PRIOR_SD says so: its values' prior spread is then what
        its measured values show (one EM step for each knob's variance), so a value of it never measured may differ
        as much."""
        if not observations:
            return self
        x = np.array([self.row(knobs) for knobs, _, _ in observations])
        y = np.array([r for _, r, _ in observations])
        w = 1.0 / np.array([var + RESIDUAL_SD ** 2 for _, _, var in observations])
        measured = x.any(axis=0)
        self._condition(x, y, w)
        for columns in self.knob_columns.values():
            seen = [c for c in columns if measured[c]]
            if seen:
                spread = math.sqrt(float(np.mean(self.mean[seen] ** 2 + np.diag(self.cov)[seen])))
                self.prior_sd[columns] = max(PRIOR_SD, spread)
        self._condition(x, y, w)
        self.n = len(observations)
        return self

    def _condition(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        precision = self.prior_shape_inv / np.outer(self.prior_sd, self.prior_sd)
        self.cov = np.linalg.inv(precision + (x * w[:, None]).T @ x)
        self.mean = self.cov @ ((x * w[:, None]).T @ y)

    def diff(self, a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
        """(mean, standard deviation) of log(effect of a / effect of b)."""
        d = self.row(a) - self.row(b)
        return float(d @ self.mean), math.sqrt(max(float(d @ self.cov @ d), 0.0))


def _ordered_prior(n: int) -> np.ndarray:
    """Prior covariance (in units of the knob's variance) of an ordered knob's n values by rank: a trend across
    the range (TREND_SHARE of the variance, on average over the values) plus steps around it that correlate by
    NEIGHBOUR_CORRELATION^distance. Without the trend a value beyond the measured ones reverted towards the mean:
    16 threads slower than 12, 12 slower than 8, put 4 below 8 by half of 8's lead (synthetic-388 at 8 GiB: 4 was
    the best, 14% faster than 8, and came as the 16th trial)."""
    ranks = np.arange(n)
    z = ranks - ranks.mean()
    trend = np.outer(z, z) / np.mean(z * z)
    steps = NEIGHBOUR_CORRELATION ** np.abs(ranks[:, None] - ranks[None, :])
    return TREND_SHARE * trend + (1 - TREND_SHARE) * steps


def numeric(values: Sequence[Any]) -> bool:
    """Numbers, not flags: values with an order."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _key(value: Any) -> str:
    """Values compare as the trials store them (8 and 8.0 are one value)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
