"""Statistics on synthetic samples with known answers: intervals cover, planted differences are found, equal
distributions are called a tie at the stated rate."""

from __future__ import annotations

import numpy as np
import pytest

from autoinfer.measure.stats import bootstrap_ci, compare, compare_paired, cv, holm, summarize


def test_cv_known_value():
    assert cv([9.0, 10.0, 11.0]) == pytest.approx(0.1)
    assert cv([5.0, 5.0, 5.0]) == 0.0


def test_cv_and_ci_refuse_too_few_samples():
    with pytest.raises(ValueError, match="at least 2"):
        cv([1.0])
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_ci([3.0])
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci([1.0, float("nan")])


def test_bootstrap_ci_brackets_the_median_and_is_reproducible():
    samples = [10.0, 11.0, 9.5, 10.5, 30.0, 10.2, 9.8]
    low, high = bootstrap_ci(samples)
    assert low <= float(np.median(samples)) <= high
    assert high < 30.0  # the median's interval ignores one outlier
    assert bootstrap_ci(samples, seed=3) == bootstrap_ci(samples, seed=3)
    assert bootstrap_ci([4.0, 4.0, 4.0]) == (4.0, 4.0)


def test_bootstrap_ci_covers_the_true_median_near_the_stated_rate():
    rng = np.random.default_rng(1)
    trials, covered = 200, 0
    for _ in range(trials):
        low, high = bootstrap_ci(rng.normal(100.0, 10.0, size=25), n_resamples=1000, seed=int(rng.integers(1 << 30)))
        covered += low <= 100.0 <= high
    assert 0.88 <= covered / trials <= 0.995


@pytest.mark.parametrize("test", ["mannwhitney", "welch"])
def test_planted_difference_is_detected(test):
    rng = np.random.default_rng(7)
    fast = rng.normal(110.0, 3.0, size=8)
    slow = rng.normal(100.0, 3.0, size=8)
    result = compare(fast, slow, test=test)
    assert result.differ and result.p_value < 0.05 and result.test == test
    assert result.ratio_ci[0] > 1.0  # the interval of median(fast)/median(slow) excludes "no difference"
    assert result.ratio_ci[0] <= result.ratio <= result.ratio_ci[1]
    assert result.ratio == pytest.approx(1.10, abs=0.05)


@pytest.mark.parametrize("test,low,high", [("mannwhitney", 0.015, 0.08), ("welch", 0.02, 0.085)])
def test_equal_distributions_tie_at_the_stated_rate(test, low, high):
    """Same distribution on both sides: 'differ' in about alpha of the cases (Mann-Whitney's exact test is
    slightly conservative). 400 repetitions: the binomial standard error is ~0.011."""
    rng = np.random.default_rng(11)
    reps = 400
    false_alarms = sum(compare(rng.normal(50, 5, 8), rng.normal(50, 5, 8), test=test).differ for _ in range(reps))
    assert low <= false_alarms / reps <= high


def test_three_runs_per_side_can_never_differ_with_mann_whitney():
    result = compare([1.0, 2.0, 3.0], [10.0, 11.0, 12.0])
    assert result.p_value == pytest.approx(0.1)
    assert not result.differ


def test_tied_values_keep_the_exact_small_sample_distribution():
    """With ties scipy would switch to a normal approximation (p=0.047 for 3 vs 3); the permutation test keeps
    the exact answer."""
    assert compare([5.0, 5.0, 5.0], [6.0, 6.0, 6.0]).p_value == pytest.approx(0.1)
    assert compare([5.0] * 5, [6.0] * 5).p_value == pytest.approx(2 / 252)


def test_identical_constant_samples_are_a_tie():
    for test in ("mannwhitney", "welch"):
        result = compare([5.0, 5.0, 5.0], [5.0, 5.0, 5.0], test=test)
        assert result.p_value == 1.0 and not result.differ and result.ratio_ci == (1.0, 1.0)


def test_compare_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown test"):
        compare([1, 2], [3, 4], test="ks")
    with pytest.raises(ValueError, match="alpha"):
        compare([1, 2], [3, 4], alpha=1.5)


def test_paired_rounds_see_through_a_drift_that_hides_a_difference_between_medians():
    """Both sides rise 20% over five rounds and a is 5% faster within each round: the medians' ratio cannot tell
    (its interval spans 1), the rounds' ratios can."""
    rng = np.random.default_rng(3)
    drift = np.linspace(100.0, 120.0, 5)
    b = drift * rng.normal(1.0, 0.01, 5)
    a = 1.05 * drift * rng.normal(1.0, 0.01, 5)
    unpaired, paired = compare(a, b), compare_paired(a, b)
    assert unpaired.ratio_ci[0] < 1.0 < unpaired.ratio_ci[1]
    assert paired.differ and paired.test == "paired-t" and paired.ratio_ci[0] > 1.0
    assert paired.ratio == pytest.approx(1.05, abs=0.02)
    mirror = compare_paired(b, a)  # b/a is the mirror image of a/b
    assert mirror.ratio == pytest.approx(1 / paired.ratio)
    assert mirror.ratio_ci == pytest.approx((1 / paired.ratio_ci[1], 1 / paired.ratio_ci[0]))
    assert mirror.p_value == pytest.approx(paired.p_value)


def test_paired_rounds_tie_at_the_stated_rate():
    """No difference, each round's processes sharing a random load: 'differ' in about alpha of the cases, and the
    interval excludes 1 exactly when the test rejects. 400 repetitions of 5 rounds."""
    rng = np.random.default_rng(5)
    reps, false_alarms = 400, 0
    for _ in range(reps):
        load = rng.normal(100.0, 15.0, 5)
        result = compare_paired(load * rng.normal(1.0, 0.05, 5), load * rng.normal(1.0, 0.05, 5))
        assert result.differ == (not result.ratio_ci[0] <= 1.0 <= result.ratio_ci[1])
        false_alarms += result.differ
    assert 0.02 <= false_alarms / reps <= 0.085


def test_paired_rounds_with_one_ratio_and_bad_input():
    same = compare_paired([10.0, 20.0, 30.0], [10.0, 20.0, 30.0])
    assert same.p_value == 1.0 and not same.differ and same.ratio_ci == (1.0, 1.0)
    double = compare_paired([20.0, 40.0], [10.0, 20.0])
    assert double.ratio == pytest.approx(2.0) and double.differ and double.ratio_ci == pytest.approx((2.0, 2.0))
    with pytest.raises(ValueError, match="one b per a"):
        compare_paired([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        compare_paired([1.0, 0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="alpha"):
        compare_paired([1.0, 2.0], [1.0, 2.0], alpha=0.0)


def test_holm_step_down():
    # sorted p: 0.01 < 0.05/3 rejects; 0.02 < 0.05/2 rejects; 0.04 >= 0.05/1? no, 0.04 < 0.05 rejects
    assert holm([0.04, 0.01, 0.02], 0.05) == [True, True, True]
    # 0.03 >= 0.05/2 stops the procedure: neither it nor larger p-values reject
    assert holm([0.001, 0.03, 0.04], 0.05) == [True, False, False]
    assert holm([0.2, 0.001], 0.05) == [False, True]
    assert holm([], 0.05) == []


def test_summarize_handles_short_series():
    assert summarize([]).median is None
    one = summarize([7.0])
    assert one.n == 1 and one.median == 7.0 and one.ci_low is None and one.cv is None
    many = summarize([9.0, 10.0, 11.0])
    assert many.median == 10.0 and many.cv == pytest.approx(0.1)
    assert many.ci_low <= 10.0 <= many.ci_high
    assert many.to_dict() == {"n": 3, "median": 10.0, "ci": [many.ci_low, many.ci_high], "cv": many.cv}
