"""The fits recover planted parameters from noisy synthetic data, and AICc picks the family that made the data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoinfer.analysis import fits as F


def _power_data(seed: int, n: int = 60, noise: float = 0.03):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 20, n)
    y = 3.0 * (30 - x) ** 1.8 * np.exp(rng.normal(0, noise, n))
    return x, y


def _bandwidth_data(seed: int, n: int = 60, noise: float = 0.03):
    """Three model sizes, so the fixed cost and both bandwidths are separately identifiable."""
    rng = np.random.default_rng(seed)
    total = rng.choice([1.0, 1.5, 2.2], n)  # GB read per token
    cpu = total * rng.uniform(0, 1, n)
    gpu = total - cpu
    y = 1 / (0.004 + cpu / 50 + gpu / 900) * np.exp(rng.normal(0, noise, n))
    return cpu, gpu, y


def test_power_law_recovers_planted_m_and_alpha():
    x, y = _power_data(seed=0)
    fit = F.fit_power_law(x, y)
    assert fit.ci["alpha"][0] <= 1.8 <= fit.ci["alpha"][1]
    assert fit.ci["M"][0] <= 30 <= fit.ci["M"][1]
    assert fit.params["alpha"] == pytest.approx(1.8, rel=0.15)
    assert fit.params["M"] == pytest.approx(30, rel=0.1)
    assert fit.holdout_mape < 6
    assert not fit.extra["M_at_search_bound"]


def test_alpha_depends_on_the_fixed_m():
    x, y = _power_data(seed=0)
    profile = F.alpha_versus_m(x, y, [25, 30, 42, 100])
    alphas = [p["alpha"] for p in profile]
    assert alphas == sorted(alphas) and alphas[-1] > 2 * alphas[0]


def test_two_point_solve_goes_through_both_points():
    sol = F.power_law_two_point((14.7, 9.0), (12.331, 27.589), 42.0)
    pred = F.power_law_predict(sol, np.array([14.7, 9.0]))
    assert pred == pytest.approx([12.331, 27.589], rel=1e-9)


def test_bandwidth_recovers_planted_bandwidths():
    cpu, gpu, y = _bandwidth_data(seed=1)
    fit = F.fit_bandwidth(cpu, gpu, y)
    assert fit.extra["identifiable"]
    assert fit.ci["BW_cpu_GBps"][0] <= 50 <= fit.ci["BW_cpu_GBps"][1]
    assert fit.ci["BW_gpu_GBps"][0] <= 900 <= fit.ci["BW_gpu_GBps"][1]
    assert fit.params["t0_s"] == pytest.approx(0.004, rel=0.25)


def test_bandwidth_with_one_model_reports_the_marginal_cpu_cost():
    rng = np.random.default_rng(2)
    cpu = rng.uniform(0, 1.5, 50)
    gpu = 1.5 - cpu
    y = 1 / (0.004 + cpu / 50 + gpu / 900) * np.exp(rng.normal(0, 0.02, 50))
    fit = F.fit_bandwidth(cpu, gpu, y)
    assert not fit.extra["identifiable"]
    truth = 1 / (1 / 50 - 1 / 900)
    low, high = fit.extra["cpu_marginal_GBps_ci"]
    assert low <= truth <= high


def test_bandwidth_refuses_data_without_placement_variation():
    with pytest.raises(ValueError, match="same bytes"):
        F.fit_bandwidth([0.5] * 6, [0.0] * 6, [10, 11, 10.5, 9.8, 10.2, 10.1])


@pytest.mark.parametrize("truth", ["power_law", "bandwidth"])
def test_aicc_and_holdout_pick_the_true_family(truth):
    cpu, gpu, y_bw = _bandwidth_data(seed=3)
    total_cpu_gb = cpu * 10  # total weights in RAM, proportional to what a token reads there
    if truth == "power_law":
        y = 40 * (25 - total_cpu_gb) ** 1.2 / 25**1.2 * np.exp(np.random.default_rng(3).normal(0, 0.03, len(cpu)))
    else:
        y = y_bw
    fits = [F.fit_power_law(total_cpu_gb, y), F.fit_bandwidth(cpu, gpu, y)]
    win = F.winner(fits)
    assert win["by_aicc"] == truth
    assert win["by_holdout"] == truth


def test_threads_model_flags_more_threads_slower():
    rng = np.random.default_rng(4)
    t = np.repeat([1, 2, 4, 6, 8, 12, 16], 3)
    y = 1 / (0.01 + 0.2 / t + 0.002 * t) * np.exp(rng.normal(0, 0.02, t.size))
    fit = F.fit_threads(t, y)
    assert fit.ci["t_opt"][0] <= math.sqrt(0.2 / 0.002) <= fit.ci["t_opt"][1]
    assert fit.extra["more_threads_slower"]
    assert fit.extra["best_threads_measured"] in (8.0, 12.0)


def test_threads_model_does_not_flag_monotone_scaling():
    rng = np.random.default_rng(5)
    t = np.repeat([1, 2, 4, 8], 3)
    y = 1 / (0.01 + 0.2 / t) * np.exp(rng.normal(0, 0.01, t.size))
    fit = F.fit_threads(t, y)
    assert not fit.extra["more_threads_slower"]


def test_aicc_matches_its_formula():
    assert F.aicc(2.0, 20, 3) == pytest.approx(20 * math.log(0.1) + 6 + 24 / 16)
    assert F.aicc(2.0, 4, 3) == math.inf


def test_holdout_keeps_a_configurations_trials_out_of_its_training_folds():
    """Three processes of each configuration: none of them may train the fit that predicts the other two."""
    cpu, gpu, _ = _bandwidth_data(seed=3, n=20)
    x = np.repeat(np.column_stack([cpu, gpu]), 3, axis=0)
    y = np.exp(np.random.default_rng(4).normal(3, 0.1, len(x)))
    groups = np.repeat([f"config {i}" for i in range(20)], 3)
    trained: list[set[str]] = []

    def fit(xs: np.ndarray, ys: np.ndarray) -> dict[str, float]:
        trained.append({groups[np.flatnonzero((x == row).all(axis=1))[0]] for row in xs})
        return {"mean": float(np.mean(ys))}

    def predict(params: dict[str, float], xs: np.ndarray) -> np.ndarray:
        return np.full(len(xs), params["mean"])

    F.holdout_error(fit, predict, x, y, groups=groups)
    assert len(trained) == F.FOLDS
    held = [set(groups) - t for t in trained]
    assert all(len(h) == 4 for h in held)  # 20 configurations in 5 folds, whole
    assert set().union(*held) == set(groups)


def test_holdout_scores_a_configuration_not_one_processs_luck():
    """Speeds exactly the model's per configuration, each process off by its luck (log SD 0.15): scored against
    its configuration's median the hold-out error falls well below a single process's."""
    cpu, gpu, _ = _bandwidth_data(seed=5, n=30)
    exact = 1 / (0.004 + cpu / 50 + gpu / 900)
    luck = np.exp(np.random.default_rng(6).normal(0, 0.15, (30, 5)))
    y = (exact[:, None] * luck).ravel()
    groups = np.repeat(np.arange(30), 5)
    cpu5, gpu5 = np.repeat(cpu, 5), np.repeat(gpu, 5)
    per_process = F.fit_bandwidth(cpu5, gpu5, y)
    per_configuration = F.fit_bandwidth(cpu5, gpu5, y, groups=groups)
    assert per_process.holdout_mape > 10
    assert per_configuration.holdout_mape < 0.6 * per_process.holdout_mape
    assert per_configuration.aicc == per_process.aicc  # the fit itself is the same
