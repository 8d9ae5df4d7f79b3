"""Campaign-file validation: every bad input is one line naming the key, before anything is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from autoinfer.campaign.plan import host_threads
from autoinfer.campaign.space import distributions, to_config
from autoinfer.campaign.spec import check_space, load_campaign, parse_campaign
from autoinfer.engines.base import knobs_of
from autoinfer.engines.knobs import TRIAL_KNOBS
from autoinfer.errors import UserError
from autoinfer.measure import host

REPO = Path(__file__).resolve().parents[2]
SUPPORTED = TRIAL_KNOBS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["cpu-smoke.yaml", "qwen35moe-8gb.yaml"])
def test_shipped_campaigns_validate(name):
    campaign, _ = host_threads(load_campaign(REPO / "experiments" / name), cores=16)
    check_space(campaign, knobs_of(campaign.engine))  # the knobs of the engine it names
    assert campaign.searched()


@pytest.mark.parametrize(("cores", "values"), [(16, [8, 12, 16]), (32, [16, 24, 32]), (2, [1, 2]), (6, [3, 4, 6]),
                                               (1, 1)])
def test_host_threads_are_shares_of_this_machines_cores(cores, values):
    campaign, note = host_threads(parse_campaign({"name": "x", "model": "a.gguf", "space": {"threads": "host"}}),
                                  cores=cores)
    assert campaign.space["threads"] == values
    assert note.startswith(f"threads: host as {', '.join(map(str, values if cores > 1 else [values]))}: ")
    assert f"of the {cores} physical core(s)" in note
    listed = parse_campaign({"name": "x", "model": "a.gguf", "space": {"threads": [8, 12, 16]}})
    assert host_threads(listed, cores=cores) == (listed, None)


def test_host_threads_need_an_engine_that_measures_here():
    table = parse_campaign({"name": "x", "engine": "replay", "engine_options": {"table": "t.csv"}, "model": "t",
                            "space": {"threads": "host"}})
    with pytest.raises(UserError, match="space.threads: 'host' means this machine's cores, but engine 'replay'"):
        host_threads(table, cores=8)


def test_usable_physical_cores_count_the_allowed_cpus_without_hyperthreads(monkeypatch):
    monkeypatch.setattr(host.psutil, "cpu_count", lambda logical=True: 64 if logical else 32)
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: set(range(16)))  # a container of 16 CPUs
    assert host.usable_physical_cores() == 8
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0})
    assert host.usable_physical_cores() == 1


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
