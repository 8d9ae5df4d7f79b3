"""The knob effects the boundary search learns from every trial: what a measured value does, and how little is
known about a value never measured."""

from __future__ import annotations

import math

import pytest

from autoinfer.search.chance import chance_to_beat
from autoinfer.search.effects import PRIOR_SD, KnobEffects

VALUES = {"type_k": ["f16", "q8_0", "q4_0"], "flash_attn": ["off", "on"]}


def test_a_value_measured_slower_is_predicted_slower_and_one_never_measured_keeps_the_prior_spread():
    obs = [({"type_k": "f16", "flash_attn": "off"}, 0.0, 0.0001),
           ({"type_k": "q8_0", "flash_attn": "off"}, math.log(0.8), 0.0001),
           ({"type_k": "f16", "flash_attn": "on"}, math.log(0.9), 0.0001),
           ({"type_k": "q8_0", "flash_attn": "on"}, math.log(0.8 * 0.9), 0.0001)]
    effects = KnobEffects(VALUES).fit(obs)
    assert effects.n == 4
    mean, sd = effects.diff({"type_k": "q8_0", "flash_attn": "off"}, {"type_k": "f16", "flash_attn": "off"})
    # one process each, which can land RESIDUAL_SD away from another: shrunk towards 0, but slower beyond 2 SD
    assert math.log(0.8) < mean < -2 * sd
    # never measured: like a typical value of the knob (between the measured ones), with the prior's spread
    q4, sd = effects.diff({"type_k": "q4_0", "flash_attn": "off"}, {"type_k": "f16", "flash_attn": "off"})
    q8, _ = effects.diff({"type_k": "q8_0", "flash_attn": "off"}, {"type_k": "f16", "flash_attn": "off"})
    assert q8 < q4 < 0 and sd > PRIOR_SD


def test_two_values_that_hurt_alone_and_help_together_are_learned_as_a_pair():
    """q8_0 alone 10% slower, flash attention alone 10% slower, both together 5% faster: measured in 16 processes
    each, the pair's prediction follows the measurement (against the sum of the singles, 19% slower) and is surer
    than a pair never measured, which keeps the prior's spread. (Two processes each are not enough: one process
    lands up to RESIDUAL_SD away from another, and pairs start from a small prior.)"""
    truth = {("f16", "off"): 0.0, ("q8_0", "off"): math.log(0.9), ("f16", "on"): math.log(0.9),
             ("q8_0", "on"): math.log(1.05)}
    obs = [({"type_k": k, "flash_attn": f}, y, 0.0001) for (k, f), y in truth.items()] * 16
    effects = KnobEffects(VALUES).fit(obs)
    base = {"type_k": "f16", "flash_attn": "off"}
    both, sd = effects.diff({"type_k": "q8_0", "flash_attn": "on"}, base)
    assert both == pytest.approx(math.log(1.05), abs=0.01)
    one, _ = effects.diff({"type_k": "q8_0", "flash_attn": "off"}, base)
    assert math.log(0.9) < one < -sd
    _, unknown = effects.diff({"type_k": "q4_0", "flash_attn": "on"}, base)
    assert unknown > PRIOR_SD and unknown > 2 * sd


def test_a_trend_along_an_ordered_knob_carries_to_the_next_value_never_measured():
    """16 threads 10% slower than 12, 8 threads 10% faster: 4 threads, never measured, is predicted closer to 8 than a
    value of an unordered knob with the same measurements would be, so its chance to beat 8 is larger."""
    speeds = {16: math.log(0.9), 12: 0.0, 8: math.log(1.1)}

    def chance_of_four(values):
        obs = [({"threads": values[t]}, y, 0.0001) for t, y in speeds.items()] * 4
        effects = KnobEffects({"threads": list(values.values())}).fit(obs)
        return chance_to_beat(*effects.diff({"threads": values[4]}, {"threads": values[8]}))

    ordered = chance_of_four({t: t for t in (4, 8, 12, 16)})
    unordered = chance_of_four({t: f"t{t}" for t in (4, 8, 12, 16)})
    assert ordered > unordered + 0.05


def test_a_monotone_trend_is_expected_to_go_on_one_value_past_the_measured_ones():
    """16 < 12 < 8 threads, 10% a step: 4 threads is expected to beat 8, not to fall back towards the knob's mean
    (steps that only correlate with their neighbours put it 4% below 8, a 29% chance: synthetic-388 at 8 GiB, where 4
    was the best and came as the 16th trial)."""
    speeds = {16: math.log(0.9), 12: 0.0, 8: math.log(1.1)}
    obs = [({"threads": t}, y, 0.0001) for t, y in speeds.items()] * 4
    mean, sd = KnobEffects({"threads": [4, 8, 12, 16]}).fit(obs).diff({"threads": 4}, {"threads": 8})
    assert mean > 0 and chance_to_beat(mean, sd) > 0.6


def test_the_level_of_raw_speeds_goes_to_the_intercept_not_to_the_values_measured():
    """Without a performance model the residuals are raw log speeds (log 60 ≈ 4.1). One configuration measured: every
    move from it is as likely to be faster as slower; a narrow intercept prior left part of that level to the values
    measured, so every move looked 1-3% slower."""
    values = {"threads": [1, 2, 4], **VALUES}
    at = {"threads": 4, "type_k": "f16", "flash_attn": "off"}
    effects = KnobEffects(values).fit([(at, math.log(60.0), 0.0001)])
    for move in ({"threads": 2}, {"threads": 1}, {"type_k": "q8_0"}, {"flash_attn": "on"}):
        mean, _ = effects.diff({**at, **move}, at)
        assert mean == pytest.approx(0.0, abs=0.002), move
