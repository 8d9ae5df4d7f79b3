"""Deployment check: the recommended `llama-server` command, started once exactly as printed, must answer a
completion before the sweep calls it a recommendation (the reference engine's printed generate command must generate
text: run_generate_check).

The sweep measures with llama-bench; the command it prints is another program. Starting that command catches what a
measurement cannot see (a model without a tokenizer, a flag the server lacks, a library it cannot find) before a
user pastes it. Only `--host 127.0.0.1 --port N` are added, so the check never collides with a server already
listening on the default port. The prompt is as long as the measurement's (check_prompt): the server's peak then
holds what computing batches of that size allocates, as llama-bench's pp test did; a 4-token prompt never computes
a full ubatch, so its peak says less about the server a user sends long prompts to. The result is recorded on the
study and shown by `status` and the report.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from dataclasses import replace
from typing import Callable

import optuna

from autoinfer.campaign.spec import Campaign
from autoinfer.engines import base
from autoinfer.engines.base import TrialConfig, capabilities
from autoinfer.engines.llama_common import LlamaToolsEngine, classify_failure, env_words, server_context
from autoinfer.engines.llama_server import Client, RequestRejected, ServerGone, free_port, prompt_tokens, wait_healthy
from autoinfer.engines.reference import options_of
from autoinfer.errors import UserError
from autoinfer.export.formats import render
from autoinfer.measure.gpu import measured_gpus
from autoinfer.measure.process import IsolatedProcess, run_isolated
from autoinfer.store import trials as store
from autoinfer.store.records import DeploymentCheck, TrialRecord
from autoinfer.store.trials import Store

N_PREDICT = 8
_POLL_S = 0.1
_EXIT_WAIT_S = 3.0  # a server that dropped the connection is usually still dying (an abort writes a core first)


def check_prompt(config: TrialConfig) -> int:
    """The prompt's tokens for a check of `config`'s server: the measurement's prompt (at least one token), within
    the context the printed server holds beside the generated tokens."""
    return max(1, min(config.n_prompt, server_context(config) - N_PREDICT - 1))


def run_check(command: list[str], timeout_s: float, n_prompt: int, trial: int | None = None,
              gpus: tuple[int, ...] = ()) -> DeploymentCheck:
    """Start `command` (plus a loopback port), wait until healthy, ask for a completion of an `n_prompt`-token prompt
    (check_prompt), stop it; its peak memory is sampled as a trial's is (VRAM on `gpus`)."""
    port = free_port()
    argv = [*command, "--host", "127.0.0.1", "--port", str(port)]
    started = time.monotonic()
    client = Client(port, started + timeout_s)
    printed = shlex.join(command)

    res = None

    def result(status: str, reason: str, answer: str = "", tokens: int = 0) -> DeploymentCheck:
        return DeploymentCheck(status, reason, trial, printed, answer, tokens, round(time.monotonic() - started, 2),
                               res.vram_peak_mib if res else None, res.rss_peak_mib if res else None,
                               prompt_tokens=n_prompt)

    proc = IsolatedProcess(argv, env=dict(os.environ), gpus=gpus)
    try:
        proc.start()
    except UserError as exc:  # the program is missing or not executable
        return result("failed", str(exc))
    failure, died = None, False
    try:
        wait_healthy(proc, client)
        prompt = prompt_tokens(client, n_prompt, 1)[0]
        data = client.post("/completion", {"prompt": prompt, "n_predict": N_PREDICT, "ignore_eos": True})
    except (ServerGone, RequestRejected, TimeoutError) as exc:
        failure, died = str(exc), _exited(proc, _EXIT_WAIT_S)
    finally:  # the server's whole process group, however the check ended
        res = proc.stop()
    if failure is not None:
        if died:  # its exit status and stderr say why (an assertion, a missing library, an unknown flag)
            failure = f"{failure}: {classify_failure(res.returncode, res.signal, False, res.stderr)[1]}"
        return result("failed", failure)
    content, tokens = data.get("content"), int(data.get("tokens_predicted") or 0)
    if not isinstance(content, str) or tokens < 1:
        return result("failed", f"/completion answered without generated text: {str(data)[:200]}")
    return result("passed", "", " ".join(content.split())[:60], tokens)


def generate_prompt(config: TrialConfig) -> int:
    """The prompt's tokens for a check of a generate command: the measurement's, within the engine's max_context
    beside the generated tokens."""
    return max(1, min(config.n_prompt, options_of(config).max_context - N_PREDICT))


def run_generate_check(command: list[str], timeout_s: float, n_prompt: int, trial: int | None = None,
                       gpus: tuple[int, ...] = ()) -> DeploymentCheck:
    """Run a printed generate command (refengine/generate.py) to its end for N_PREDICT tokens past any end of
    sequence, its prompt's tokens repeated to `n_prompt` (the measurement's, so its peak holds a prefill as long);
    its peak memory is sampled as a trial's is. It passes if it exits 0 having generated them."""
    printed = shlex.join(command)
    argv = [*command, "--prompt-tokens", str(n_prompt), "--n-predict", str(N_PREDICT), "--ignore-eos"]
    started = time.monotonic()
    try:
        res = run_isolated(argv, timeout_s=timeout_s, env=dict(os.environ), gpus=gpus)
    except UserError as exc:  # the interpreter is missing
        return DeploymentCheck("failed", str(exc), trial, printed, "", 0, 0.0, program="generate", request="")
    wall = round(time.monotonic() - started, 2)

    def result(status: str, reason: str, answer: str = "", tokens: int = 0, prompt: int = 0) -> DeploymentCheck:
        return DeploymentCheck(status, reason, trial, printed, answer, tokens, wall, res.vram_peak_mib,
                               res.rss_peak_mib, prompt_tokens=prompt, program="generate", request="")

    if res.timed_out:
        return result("failed", f"generate did not finish within {timeout_s:.0f} s")
    if res.returncode != 0:
        said = [line for line in res.stderr.splitlines() if line.strip()]
        return result("failed", f"generate exited with status {res.returncode}: {said[-1] if said else 'no message'}")
    stats = re.search(r"prompt: (\d+) tokens.*generated: (\d+) tokens", res.stderr)
    if stats is None or int(stats.group(2)) < 1:
        return result("failed", f"generate wrote no tokens: {' '.join(res.stderr.split())[:200]}")
    return result("passed", "", " ".join(res.stdout.split())[:60], int(stats.group(2)), int(stats.group(1)))


def _exited(proc: IsolatedProcess, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while proc.running and time.monotonic() < deadline:
        time.sleep(_POLL_S / 2)
    return not proc.running


def check_recommendation(study: optuna.Study, campaign: Campaign, best: store.Best | None,
                         announce: Callable[[], None] = lambda: None) -> DeploymentCheck:
    """Check the recommendation `best` of a finished sweep and record the result on the study; `announce` is called
    just before a server is started (a check that is skipped starts nothing to announce)."""
    engine = base.create(campaign.engine, **campaign.engine_options)
    if best is None:
        check = DeploymentCheck("skipped", "no recommended configuration to start", None, "", "", 0, 0.0)
    elif capabilities(campaign.engine).generates:
        announce()
        command = shlex.split(render("generate", best, study.study_name, campaign.engine))
        check = against_budget(run_generate_check(command, campaign.measure.timeout_s, generate_prompt(best.config),
                                                  best.trial.number, tuple(measured_gpus())), best.trial, campaign)
    elif not isinstance(engine, LlamaToolsEngine):
        check = DeploymentCheck("skipped", f"the {campaign.engine} engine did not run llama.cpp's tools on this "
                                "machine, so its configuration is not started here", best.trial.number, "", "", 0,
                                0.0)
    else:
        command = shlex.split(render("server", best, study.study_name, campaign.engine))
        binary = command[len(env_words(best.config))]  # after the `env NAME=VALUE` its knobs set
        if os.sep not in binary and shutil.which(binary) is None:
            check = DeploymentCheck("skipped", f"the printed command runs {binary} from PATH and there is none on "
                                    "this machine's PATH; put a llama.cpp build's bin folder there (`autoinfer doctor` "
                                    "shows the build)", best.trial.number, shlex.join(command), "", 0, 0.0)
        else:
            announce()
            check = against_budget(run_check(command, campaign.measure.timeout_s, check_prompt(best.config),
                                             best.trial.number, tuple(measured_gpus())), best.trial, campaign)
    record(study, check)
    return check


def against_budget(check: DeploymentCheck, trial: TrialRecord, campaign: Campaign) -> DeploymentCheck:
    """The server's peak beside the sweep's measurement of the same configuration and the campaign's budget. The
    sweep measured llama-bench, whose process is not llama-server's. On an H100 the printed server (one slot)
    peaked 98-294 MiB below llama-bench at three recommendations of 8, 12 and 16 GiB, asked for a 4-token prompt
    (left to its default four slots, 188 MiB more: a hybrid model's recurrent state per slot;
    benchmarks/results/server-memory-h100.md): a server over a VRAM budget is an answer that does not hold, and
    fails the check. In RAM the server's own process is larger than llama-bench's (34-36 against 30 MiB on the tiny
    model, the same file), so over a RAM budget is said and recorded, not failed. Where the budget counted a serving
    context llama-bench did not create, the server runs at it, and its peak is said beside that count too."""
    gpu = check.vram_peak_mib is not None
    peak = check.vram_peak_mib if gpu else check.rss_peak_mib
    if peak is None:
        return check
    side = "VRAM" if gpu else "RSS"
    measured = trial.vram_peak_mib if gpu else trial.rss_peak_mib
    budget = campaign.constraints.vram_mib if gpu else campaign.constraints.ram_mib
    words = f"{check.program}'s peak {side} {peak:.0f} MiB"
    if measured:
        served = trial.context_mib and campaign.constraints.side == ("device" if gpu else "host")
        words += f" (the sweep measured {measured:.0f}" + (
            f" and counted {trial.budget_peak(campaign.constraints.side):.0f} with the serving context)" if served
            else ")")
    over = budget is not None and peak > budget
    if budget is not None:
        words += f", over the {budget:.0f} MiB budget by {peak - budget:.0f}" if over else \
            f", within the {budget:.0f} MiB budget"
    checked = replace(check, memory=words, over_budget=over)
    if over and gpu and check.passed:
        return replace(checked, status="failed", reason=f"as printed, {check.program} went over the {budget:.0f} "
                                                        "MiB VRAM budget")
    return checked


def record(study: optuna.Study, check: DeploymentCheck) -> None:
    """The only write of the check to the store."""
    Store(study).write_study(deployment_check=check)


def stored(study: optuna.Study) -> DeploymentCheck | None:
    """The only read of the check from the store."""
    return Store(study).study_record().deployment_check
