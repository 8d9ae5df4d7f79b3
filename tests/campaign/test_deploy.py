"""The deployment check: the recommended llama-server command, started as printed, must serve a completion.

Real llama-server (the CPU build) on tiny synthetic models: one with the shipped tokenizer (it serves), one without
(llama-server aborts on the first completion, which is what a pasted command did before models carried one).
"""

from __future__ import annotations

from dataclasses import replace

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import parse_campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.model.synth import cached_model
from autoinfer.store.records import TrialRecord
from autoinfer.sweep.deploy import N_PREDICT, DeploymentCheck, against_budget, check_prompt, record, run_check, stored


def _command(llama_tools, model) -> list[str]:
    return [str(llama_tools.tool("llama-server")), "-m", str(model), "-t", "1", "-c", "256"]


def test_a_model_with_the_tokenizer_serves_a_completion(llama_tools):
    command = _command(llama_tools, cached_model("tiny", "Q8_0"))
    check = run_check(command, timeout_s=120, n_prompt=64, trial=3)
    assert check.status == "passed", check.reason
    assert check.tokens == N_PREDICT and check.trial == 3 and 0 < check.wall_s < 120
    assert check.command.split() == command  # recorded as printed, without the loopback address added
    assert check.line().startswith(f"passed: llama-server answered /completion to a 64-token prompt with {N_PREDICT} "
                                   "tokens")


def test_the_prompt_is_the_measurements_within_the_servers_context():
    """As long as llama-bench's pp test, so the server computes batches of that size while its peak is sampled; a
    server whose context is shorter gets what fits beside the generated tokens."""
    assert check_prompt(TrialConfig("m.gguf", n_prompt=512, n_gen=64)) == 512
    short = TrialConfig("m.gguf", n_prompt=512, n_gen=64, extra=(("ctx_size", 256),))
    assert check_prompt(short) == 256 - N_PREDICT - 1
    assert check_prompt(TrialConfig("m.gguf", n_prompt=0, n_gen=64)) == 1


def test_the_servers_peak_is_set_against_the_sweeps_and_the_budget(llama_tools):
    """The sweep measured llama-bench; the check measures the printed llama-server, and says where its peak stands
    (RSS here, VRAM on a GPU)."""
    check = run_check(_command(llama_tools, cached_model("tiny", "Q8_0")), timeout_s=120, n_prompt=64, trial=3)
    assert check.passed and check.vram_peak_mib is None and check.rss_peak_mib > 1, check
    peak = check.rss_peak_mib
    trial = TrialRecord(3, TrialState.COMPLETE, values=(1.0,), rss_peak_mib=peak - 20)

    def campaign(ram_mib: float | None):
        return parse_campaign({"name": "c", "model": "m.gguf", "constraints": {"ram_mib": ram_mib}})

    over = against_budget(check, trial, campaign(peak - 10))
    assert over.over_budget and over.passed
    assert over.line().endswith(f"llama-server's peak RSS {peak:.0f} MiB (the sweep measured {peak - 20:.0f}), over "
                                f"the {peak - 10:.0f} MiB budget by {peak - (peak - 10):.0f}")
    within = against_budget(check, trial, campaign(peak + 10))
    assert not within.over_budget and within.line().endswith(f", within the {peak + 10:.0f} MiB budget")
    assert not against_budget(check, trial, campaign(None)).memory.endswith("budget")


def test_a_server_over_the_vram_budget_fails_the_check():
    """On a GPU the printed server peaked below llama-bench at every recommendation measured (with a 4-token prompt):
    over the VRAM budget the answer does not hold (over a RAM budget it is a warning, the test above)."""
    served = DeploymentCheck("passed", "", 3, "llama-server -m m.gguf", "the", 8, 1.5, 8300.0, 900.0)
    trial = TrialRecord(3, TrialState.COMPLETE, values=(1.0,), vram_peak_mib=8070.0)
    campaign = parse_campaign({"name": "c", "model": "m.gguf", "constraints": {"vram_mib": 8192}})
    over = against_budget(served, trial, campaign)
    assert over.status == "failed" and over.over_budget
    assert over.line() == ("failed: as printed, llama-server went over the 8192 MiB VRAM budget (trial 3); "
                           "llama-server's peak VRAM 8300 MiB (the sweep measured 8070), over the 8192 MiB budget by "
                           "108")
    within = against_budget(replace(served, vram_peak_mib=8000.0), trial, campaign)
    assert within.passed and not within.over_budget
    served_context = replace(trial, vram_peak_mib=7350.0, context_mib=641.0)  # 32768 tokens the bench did not hold
    assert against_budget(replace(served, vram_peak_mib=7892.0), served_context, campaign).memory == (
        "llama-server's peak VRAM 7892 MiB (the sweep measured 7350 and counted 7991 with the serving context), "
        "within the 8192 MiB budget")


def test_a_model_without_a_tokenizer_fails_the_check_with_the_reason(llama_tools):
    check = run_check(_command(llama_tools, cached_model("tiny", "Q8_0", tokenizer="none")), timeout_s=120,
                      n_prompt=64)
    assert check.status == "failed" and not check.passed
    assert "Tokenizer not initialized" in check.reason or "tokenizer" in check.reason.lower(), check.reason


def test_a_missing_binary_fails_the_check(tmp_path):
    check = run_check([str(tmp_path / "llama-server"), "-m", "x.gguf"], timeout_s=10, n_prompt=64)
    assert check.status == "failed" and "llama-server" in check.reason


def test_the_check_is_stored_on_the_study():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    assert stored(study) is None
    check = DeploymentCheck("failed", "llama-server exited before it was ready", 2, "llama-server -m m.gguf", "", 0,
                            1.5)
    record(study, check)
    assert stored(study) == check and check.line() == "failed: llama-server exited before it was ready (trial 2)"
    measured = DeploymentCheck("passed", "", 2, "llama-server -m m.gguf", "the", 8, 1.5, 8090.0, 900.0,
                               "llama-server's peak VRAM 8090 MiB, within the 8192 MiB budget")
    record(study, measured)
    assert stored(study) == measured and measured.line().endswith("; llama-server's peak VRAM 8090 MiB, within the "
                                                                  "8192 MiB budget")


def test_a_generate_command_passes_only_if_it_exits_0_having_generated(tmp_path):
    """The reference engine's printed generate command, run to its end (run_generate_check): stand-ins that end the
    ways the real one can, and the real one on the tiny synthetic model."""
    import sys

    from autoinfer.engines.reference import generate_command
    from autoinfer.sweep.deploy import generate_prompt, run_generate_check

    def stand_in(code: str) -> list[str]:
        return [sys.executable, "-c", code]

    said = "import sys; print('hi there'); print('prompt: 5 tokens in 0.1 s, 50 tok/s; generated: 8 tokens', " \
           "file=sys.stderr)"
    assert run_generate_check(stand_in(said), 30, 5, trial=2).line().startswith(
        "passed: generate answered to a 5-token prompt with 8 tokens ('hi there')")
    refused = stand_in("import sys; print('error: the model file is gone', file=sys.stderr); sys.exit(2)")
    assert run_generate_check(refused, 30, 5).reason == "generate exited with status 2: error: the model file is gone"
    assert "generate wrote no tokens" in run_generate_check(stand_in("pass"), 30, 5).reason
    assert "did not finish within 1 s" in run_generate_check(stand_in("import time; time.sleep(30)"), 1, 5).reason

    config = TrialConfig(str(cached_model("tiny", "Q8_0")), n_prompt=64, n_gen=16, extra=(("torch_threads", 1),))
    assert generate_prompt(config) == 64
    assert generate_prompt(TrialConfig("m.gguf", n_prompt=512, n_gen=16, extra=(("max_context", 256),))) == \
        256 - N_PREDICT
    check = run_generate_check(generate_command(config), 300, generate_prompt(config), trial=0)
    assert check.status == "passed" and check.tokens == N_PREDICT and check.prompt_tokens == 64, check.reason
    assert check.rss_peak_mib and check.command.endswith("--torch-threads 1 --prompt Hello")
