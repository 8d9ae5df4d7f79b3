"""Campaign keys of the search: validated with one-line messages naming the key."""

from __future__ import annotations

import pytest

from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.knobs import TRIAL_KNOBS
from autoinfer.errors import UserError


def test_defaults_and_pareto_objective():
    c = parse_campaign({"name": "x", "model": "a.gguf", "objective": "pareto",
                        "space": {"placement": ["first", "last"], "cpu_expert_layers": {"low": 0, "high": 8}}})
    assert c.search.informed and c.search.skip_predicted and c.search.prune_below == 0.5
    assert c.objective_weights() == {"tg": 0.5, "pp": 0.5}
    check_space(c, TRIAL_KNOBS)  # placement keys are fine for engines that take overrides


@pytest.mark.parametrize("data, needle", [
    ({"search": {"z": -1}}, "search.z"),
    ({"search": {"prune_below": 1.5}}, "search.prune_below"),
    ({"search": {"neighbors": 2}}, "search.neighbors: unknown key"),
    ({"objective": "front"}, "objective"),
])
def test_bad_search_keys(data, needle):
    with pytest.raises(UserError, match=needle):
        parse_campaign({"name": "x", "model": "a.gguf", **data})


@pytest.mark.parametrize("space, needle", [
    ({"placement": ["first", "middle"]}, "'middle' is not one of first, last, even"),
    ({"cpu_expert_layers": [-1, 2]}, "space.cpu_expert_layers: -1 is negative"),
])
def test_bad_placement_values(space, needle):
    c = parse_campaign({"name": "x", "model": "a.gguf", "space": space})
    with pytest.raises(UserError, match=needle):
        check_space(c, TRIAL_KNOBS)
