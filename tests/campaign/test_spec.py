"""Campaign-file validation: every bad input is one line naming the key, before anything is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from autoinfer.campaign.space import distributions, to_config
from autoinfer.campaign.spec import check_space, load_campaign, parse_campaign
from autoinfer.engines.knobs import TRIAL_KNOBS
from autoinfer.errors import UserError

REPO = Path(__file__).resolve().parents[2]
SUPPORTED = TRIAL_KNOBS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["cpu-smoke.yaml", "qwen35moe-8gb.yaml"])
def test_shipped_campaigns_validate(name):
    campaign = load_campaign(REPO / "experiments" / name)
    check_space(campaign, SUPPORTED)
    assert campaign.searched()


def test_distributions_and_config_merge():
    c = parse_campaign({"name": "x", "model": ["a.gguf", "b.gguf"],
                        "space": {"threads": {"low": 1, "high": 4}, "batch": [64, 128], "ubatch": 32,
                                  "flash_attn": ["on"]}})
    dists = distributions(c)
    assert isinstance(dists["threads"], IntDistribution) and (dists["threads"].low, dists["threads"].high) == (1, 4)
    assert dists["batch"] == CategoricalDistribution([64, 128])
    assert set(dists) == {"threads", "batch", "model"}  # single values are fixed, not searched
    cfg = to_config(c, {"threads": 3, "batch": 128, "model": "b.gguf"}, {"a.gguf": "/m/a", "b.gguf": "/m/b"})
    assert (cfg.threads, cfg.batch, cfg.ubatch, cfg.flash_attn, str(cfg.model)) == (3, 128, 32, "on", "/m/b")
    assert cfg.n_prompt == c.measure.n_prompt and cfg.repetitions == c.measure.repetitions


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: x\nmodel: a.gguf\nspace: {threads: [1, 2}\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a YAML mapping"),
        ("name: x\nmodel: a.gguf\nspaec: {}\n", "spaec: unknown key"),
        ("model: a.gguf\n", "name: required key is missing"),
        ("name: x\nmodel: []\n", "model"),
        ("name: x\nmodel: a.gguf\nbudget: {trials: 0}\n", "budget.trials"),
        ("name: x\nmodel: a.gguf\nconstraints: {vram_mib: -5}\n", "constraints.vram_mib"),
        ("name: x\nmodel: a.gguf\nspace: {threads: {low: 4, high: 1}}\n", "space.threads"),
        ("name: x\nmodel: a.gguf\nspace: {ubatch: {low: 32, high: 512, step: 32, log: true}}\n", "takes no step"),
        ("name: x\nmodel: a.gguf\nmeasure: {n_prompt: 0, n_gen: 0}\n", "nothing would be measured"),
        ("name: x\nmodel: a.gguf\nobjective: speed\n", "objective"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, needle):
    with pytest.raises(UserError) as err:
        load_campaign(write(tmp_path, text))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "space, needle",
    [
        ({"thread": [1, 2]}, "space.thread: engine 'llama-bench' has no parameter 'thread'"),
        ({"threads": []}, "space.threads: empty list"),
        ({"type_k": ["f16", "q3_x"]}, "'q3_x' is not one of"),
        ({"batch": ["big"]}, "'big' is not a number"),
        ({"model": ["a.gguf"]}, "top-level key 'model'"),
    ],
)
def test_space_checked_against_engine(space, needle):
    c = parse_campaign({"name": "x", "model": "a.gguf", "space": space})
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        check_space(c, SUPPORTED)


def test_missing_campaign_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_campaign(tmp_path / "nope.yaml")
