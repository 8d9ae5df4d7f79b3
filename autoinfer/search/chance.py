"""How likely a candidate is to beat the incumbent, and by how much, from the models' predicted log gain over it and
that prediction's standard deviation (a normal belief): what every step of the boundary search ranks and gates by."""

from __future__ import annotations

import math

KAPPA = 1.0  # standard deviations of the model's prediction a candidate may fall short and still be measured
GATE = 0.5 * math.erfc(KAPPA / math.sqrt(2))  # the same as a chance to beat the incumbent (16%)


def chance_to_beat(gain: float, sd: float) -> float:
    """Probability that a candidate beats the incumbent, from the predicted log gain and its standard deviation."""
    if sd <= 0:
        return 1.0 if gain > 0 else 0.0
    return 0.5 * math.erfc(-gain / (sd * math.sqrt(2)))


def worth(gain: float, sd: float) -> float:
    """Expected improvement over the incumbent in log speed, E[max(0, g)] for g ~ N(gain, sd): it tells a likely
    gain of a percent from a less likely one of a quarter, which the chance to beat the incumbent does not."""
    if sd <= 0:
        return max(gain, 0.0)
    z = gain / sd
    return sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) + gain * chance_to_beat(gain, sd)
