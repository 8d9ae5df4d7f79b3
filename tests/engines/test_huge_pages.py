"""`huge_pages` as a campaign knob: validated, spelled as flags and an environment the measured child and the printed
commands both get, refused where the host has no huge pages, and real: the weights land on huge pages."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from autoinfer.campaign import plan as plans
from autoinfer.campaign.spec import check_space, parse_campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.engines.llama_bench import LlamaBenchEngine
from autoinfer.engines.llama_common import (
    HUGE_PAGES,
    bench_args,
    child_environment,
    env_words,
    knob_environment,
    server_args,
)
from autoinfer.engines.llama_cpp_python import LlamaCppPythonEngine
from autoinfer.engines.llama_server import LlamaServerEngine
from autoinfer.errors import UserError
from autoinfer.measure.host import THP_MODE, huge_pages_refusal
from autoinfer.measure.process import run_isolated
from autoinfer.model.synth import cached_model
from autoinfer.store.records import TrialRecord

from .helpers import context, trial


def test_the_llama_cpp_tools_take_the_knob_and_the_campaign_checks_its_values():
    assert "huge_pages" in LlamaBenchEngine.knobs and "huge_pages" in LlamaServerEngine.knobs
    assert "huge_pages" not in LlamaCppPythonEngine.knobs  # Llama() has no keyword for the host buffer
    check_space(parse_campaign({"name": "c", "model": "m.gguf", "space": {"huge_pages": [0, 1]}}),
                LlamaBenchEngine.knobs)
    with pytest.raises(UserError, match="space.huge_pages: 2 is not valid; give 0 or 1"):
        check_space(parse_campaign({"name": "c", "model": "m.gguf", "space": {"huge_pages": [0, 2]}}),
                    LlamaBenchEngine.knobs)


def test_on_it_is_no_host_buffer_and_the_glibc_tunable(llama_tools, tiny_model, monkeypatch):
    on = TrialConfig(tiny_model, load_mode="none", extra=(("huge_pages", 1),))
    bench = bench_args(on, llama_tools)
    assert bench[bench.index("--no-host") + 1] == "1"
    assert "--no-host" in server_args(on, llama_tools)
    assert knob_environment(on) == HUGE_PAGES == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert env_words(on) == ["env", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]
    for off in (TrialConfig(tiny_model), TrialConfig(tiny_model, extra=(("huge_pages", 0),))):
        assert "--no-host" not in bench_args(off, llama_tools) + server_args(off, llama_tools)
        assert knob_environment(off) == {} and env_words(off) == []
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # the user's own tunables stay
    assert child_environment(on, llama_tools)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert child_environment(TrialConfig(tiny_model), llama_tools)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"


def test_the_host_check_names_what_is_missing(tmp_path):
    mode = tmp_path / "enabled"
    mode.write_text("always madvise [never]\n")
    assert huge_pages_refusal(mode, ("glibc", "2.39")) == f"transparent huge pages are off on this host ({mode}: never)"
    mode.write_text("always [madvise] never\n")
    assert huge_pages_refusal(mode, ("glibc", "2.39")) is None
    assert huge_pages_refusal(mode, ("glibc", "2.31")) == ("the C library is glibc 2.31, and glibc.malloc.hugetlb "
                                                           "needs glibc 2.35")
    assert "unreadable" in huge_pages_refusal(tmp_path / "missing", ("glibc", "2.39"))


def test_a_host_without_them_searches_zero_only_and_refuses_one_alone(monkeypatch):
    def space(value):
        return parse_campaign({"name": "c", "model": "m.gguf", "space": {"huge_pages": value}})

    monkeypatch.setattr(plans, "huge_pages_refusal", lambda: "transparent huge pages are off on this host")
    campaign, note = plans.host_huge_pages(space([0, 1]))
    assert campaign.space["huge_pages"] == 0
    assert note == "huge_pages: 0 only: transparent huge pages are off on this host, so 1 would run as 0"
    with pytest.raises(UserError, match="space.huge_pages: 1 cannot run here: transparent huge pages are off"):
        plans.host_huge_pages(space(1))
    assert plans.host_huge_pages(space(0))[1] is None
    table = parse_campaign({"name": "c", "engine": "replay", "engine_options": {"table": "t.csv"}, "model": "t.csv",
                            "space": {"huge_pages": [0, 1]}})
    assert plans.host_huge_pages(table) == (table, None)  # a table's rows say what ran
    monkeypatch.setattr(plans, "huge_pages_refusal", lambda: None)
    assert plans.host_huge_pages(space([0, 1]))[1] is None


def test_with_mapped_weights_it_runs_as_off_once_and_the_plan_says_so(tiny_model):
    """llama.cpp keeps mmap'd weights as the file's pages, never in a host buffer: huge_pages 1 there runs as 0, one
    command, so the search measures it once; a space where it could never act is refused."""
    engines = (LlamaBenchEngine(), LlamaServerEngine())
    for engine in engines:
        for mode in ("mmap", "mmap+mlock"):
            on = engine.as_run(TrialConfig(tiny_model, load_mode=mode, extra=(("huge_pages", 1),)))
            assert on == engine.as_run(TrialConfig(tiny_model, load_mode=mode, extra=(("huge_pages", 0),)))
        for mode in ("none", "mlock"):
            asked = TrialConfig(tiny_model, load_mode=mode, extra=(("huge_pages", 1),))
            assert engine.as_run(asked).get("huge_pages") == 1
    assert "--no-host" not in bench_args(engines[0].as_run(TrialConfig(tiny_model, extra=(("huge_pages", 1),))))
    ran = engines[0].as_run(TrialConfig(tiny_model, load_mode="mmap", extra=(("huge_pages", 1),)))
    shown = TrialRecord(0, TrialState.COMPLETE, params={"load_mode": "mmap", "huge_pages": 1},
                        config=ran.to_params()).shown_params
    assert shown == {"load_mode": "mmap", "huge_pages": 0}  # the recommendation line names what ran

    def space(**knobs):
        return parse_campaign({"name": "c", "model": "m.gguf", "space": knobs})

    note = plans.huge_pages_on_mapped_weights(engines[0], space(huge_pages=[0, 1], load_mode=["none", "mmap"]))
    assert note.startswith("huge_pages 1 with load_mode mmap runs as 0: ")
    assert plans.huge_pages_on_mapped_weights(engines[0], space(huge_pages=[0, 1], load_mode="none")) is None
    assert plans.huge_pages_on_mapped_weights(engines[0], space(load_mode=["none", "mmap"])) is None
    assert "mmap runs as 0" in plans.huge_pages_on_mapped_weights(engines[0], space(huge_pages=[0, 1]))
    with pytest.raises(UserError, match="space.huge_pages: 1 does nothing with load_mode mmap: .*add load_mode: none"):
        plans.huge_pages_on_mapped_weights(engines[0], space(huge_pages=1))


def test_the_weights_land_on_huge_pages_and_the_trial_says_how_much(llama_tools, tmp_path):
    refusal = huge_pages_refusal()
    if refusal:
        pytest.skip(f"this host cannot show it: {refusal}")
    model = cached_model("small", "Q8_0")  # 123 MiB of weights: blocks malloc takes from mmap
    engine = LlamaBenchEngine(llama_bin=llama_tools.bin_dir)
    runs = {}
    for value in (0, 1):
        config = trial(model, load_mode="none", n_prompt=64, n_gen=16, repetitions=3, extra=(("huge_pages", value),))
        argv = [str(llama_tools.tool("llama-bench")), *bench_args(config, llama_tools)]
        runs[value] = run_isolated(argv, timeout_s=120, env=child_environment(config, llama_tools),
                                   huge_pages=True).huge_pages_peak_mib
        m = engine.run(config, context(tmp_path))
        assert m.ok, m.reason
        assert ("huge_pages_mib" in m.metrics) == bool(value)  # asked for: recorded
    assert runs[1] >= 32 and m.metrics["huge_pages_mib"] >= 32, (runs, m.metrics)  # most of the weights
    if "[madvise]" in THP_MODE.read_text():  # `always` gives every large block huge pages, asked or not
        assert runs[0] < runs[1] / 4, runs


def test_llama_bench_runs_with_it_and_records_the_environment(llama_tools, tiny_model, tmp_path):
    engine = LlamaBenchEngine(llama_bin=llama_tools.bin_dir)
    m = engine.run(trial(tiny_model, load_mode="none", n_prompt=8, n_gen=4, repetitions=1,
                         extra=(("huge_pages", 1),)), context(tmp_path))
    assert m.ok, m.reason
    assert m.engine_cmd[m.engine_cmd.index("--no-host") + 1] == "1"
    assert m.env["knob_environment"] == HUGE_PAGES


def test_llama_server_runs_with_it_and_records_its_huge_pages(llama_tools, chat_model, tmp_path):
    engine = LlamaServerEngine(llama_bin=llama_tools.bin_dir)
    m = engine.run(trial(chat_model, load_mode="none", n_prompt=8, n_gen=4, repetitions=1,
                         extra=(("huge_pages", 1),)), context(tmp_path))
    assert m.ok, m.reason
    assert "--no-host" in m.engine_cmd and m.env["knob_environment"] == HUGE_PAGES
    assert m.metrics["huge_pages_mib"] is not None  # read while it served (a tiny model may hold none of them)
