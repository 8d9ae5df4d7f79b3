"""The llama-server engine: measures a configuration the way an application would see it, over HTTP.

Per trial: start llama-server on a free loopback port with the trial's flags (llama_common.server_args), wait on
/health (503 while loading; the wait is the startup time), send one warm-up request, then `repetitions` rounds of
`parallel` concurrent /completion requests (`cache_prompt: false`, `n_predict`, `ignore_eos`, streamed so the
first token's arrival gives time-to-first-token). tok/s come from the server's own `timings`; with several
slots a round's sample is the sum over its concurrent requests (aggregate throughput). The server's whole process
group is stopped when the trial ends, however it ends.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoinfer.engines.base import Measurement, Outcome, RunContext, TrialConfig, register
from autoinfer.engines.knobs import BENCH_KNOBS, MULTI_GPU_KNOBS, TRIAL_KNOBS, count
from autoinfer.engines.llama_common import (
    LlamaToolsEngine,
    child_environment,
    classify_failure,
    huge_pages_metrics,
    server_args,
    slots,
    whole_context,
)
from autoinfer.measure.process import IsolatedProcess
from autoinfer.trial_config import wants_huge_pages

#: Knobs beyond TrialConfig's fields: batch threads, context size, the number of slots (= concurrent clients) and
#: the split over several GPUs.
SERVER_KNOBS = {"threads_batch": count(), "ctx_size": count(), "parallel": count(), "repack": BENCH_KNOBS["repack"],
                "huge_pages": BENCH_KNOBS["huge_pages"], **MULTI_GPU_KNOBS}
PROMPT_TEXT = Path(__file__).resolve().parents[1] / "data" / "corpus-en.txt"
_POLL_S = 0.05
_WARMUP_TOKENS = (8, 2)  # prompt and generated tokens of the warm-up request


class ServerGone(Exception):
    """The server stopped answering (it crashed or was killed) in the middle of a trial."""


class RequestRejected(Exception):
    """The server answered a request with an error (for example a prompt longer than the context)."""


@dataclass(frozen=True)
class Completion:
    """One request as the client saw it, plus the server's own timings."""

    ttft_ms: float | None
    wall_ms: float
    timings: dict[str, Any]


def free_port() -> int:
    """A loopback port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Client:
    """Minimal HTTP client for llama-server's JSON endpoints; every call is bounded by the trial's deadline."""

    def __init__(self, port: int, deadline: float) -> None:
        self.port = port
        self.deadline = deadline

    def _connection(self) -> http.client.HTTPConnection:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("trial deadline reached")
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=left)

    def get_status(self, path: str) -> int:
        conn = self._connection()
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        conn = self._connection()
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read() or b"{}")
        except (ConnectionError, http.client.HTTPException) as exc:
            raise ServerGone(f"{path}: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise RequestRejected(_error_text(data, response.status))
        return data

    def complete(self, tokens: list[int], n_predict: int) -> Completion:
        """A streamed /completion: time to the first generated token, then the final chunk's timings."""
        body = {"prompt": tokens, "n_predict": n_predict, "cache_prompt": False, "ignore_eos": True,
                "stream": True, "top_k": 1, "samplers": ["top_k"]}
        conn = self._connection()
        started = time.monotonic()
        ttft_ms: float | None = None
        final: dict[str, Any] | None = None
        try:
            conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RequestRejected(_error_text(json.loads(response.read() or b"{}"), response.status))
            while line := response.readline():
                if not line.startswith(b"data: "):
                    continue
                chunk = json.loads(line[6:])
                if ttft_ms is None and chunk.get("tokens"):
                    ttft_ms = (time.monotonic() - started) * 1000
                if chunk.get("stop"):
                    final = chunk
                    break
                if time.monotonic() >= self.deadline:  # a steady stream never trips the socket timeout
                    raise TimeoutError("trial deadline reached while generating")
        except (ConnectionError, http.client.HTTPException, json.JSONDecodeError) as exc:
            raise ServerGone(f"/completion: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if final is None or "timings" not in final:
            raise ServerGone("/completion stream ended without the final chunk and its timings")
        return Completion(ttft_ms, (time.monotonic() - started) * 1000, final["timings"])


def _error_text(data: dict[str, Any], status: int) -> str:
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return f"HTTP {status}: {message or data}"


def prompt_tokens(client: Client, n_tokens: int, count: int) -> list[list[int]]:
    """`count` different prompts of exactly `n_tokens` tokens: the shipped text, tokenized by the model's own
    tokenizer and read at different offsets (cycled), so every request processes real, distinct tokens."""
    text = PROMPT_TEXT.read_text(encoding="utf-8")
    corpus = client.post("/tokenize", {"content": text, "add_special": False})["tokens"]
    if not corpus:
        raise RequestRejected("/tokenize returned no tokens for the prompt text")
    prompts = []
    for i in range(count):
        start = (i * max(n_tokens, 1) * 7919) % len(corpus)
        prompts.append([corpus[(start + j) % len(corpus)] for j in range(max(n_tokens, 1))])
    return prompts


@register("llama-server")
class LlamaServerEngine(LlamaToolsEngine):
    """Measures a configuration through a llama-server process, started and stopped per trial."""

    name = "llama-server"
    binary = "llama-server"
    knobs = {**TRIAL_KNOBS, **SERVER_KNOBS}

    def batch_context(self, config: TrialConfig) -> int | None:
        return whole_context(config)

    def command(self, config: TrialConfig, port: int) -> list[str]:
        """llama-server argv: the shared flags (the context sized for every slot, the slots), the address."""
        argv = [str(self.tools.tool("llama-server")), *server_args(config, self.tools)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        if "--no-webui" in self.tools.help_flags("llama-server"):
            argv.append("--no-webui")
        return argv

    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        port = free_port()
        argv = self.command(config, port)
        env = child_environment(config, self.tools)
        run_env = {**self.run_env(config), "port": port}
        deadline = time.monotonic() + ctx.timeout_s
        client = Client(port, deadline)
        with IsolatedProcess(argv, env=env, gpus=ctx.gpus, huge_pages=wants_huge_pages(config)) as proc:
            try:
                result = _measure(proc, client, config, ctx)
                failure = None
            except TimeoutError:
                result, failure = None, (Outcome.TIMEOUT, "ran past the timeout; the process group was killed")
            except RequestRejected as exc:
                result, failure = None, (Outcome.REJECTED, f"llama-server refused the request: {exc}")
            except ServerGone as exc:
                result, failure = None, (None, str(exc))
            res = proc.stop()
        common: dict[str, Any] = dict(
            engine_cmd=tuple(argv), wall_s=res.wall_s, stdout=res.stdout, stderr=res.stderr,
            vram_peak_mib=res.vram_peak_mib, vram_per_gpu_mib=res.vram_per_gpu_mib, rss_peak_mib=res.rss_peak_mib,
            env={**run_env, "vram_method": res.vram_method},
        )
        if failure is not None:
            outcome, reason = failure
            if outcome is None:  # the server died: its exit status and stderr say why
                outcome, reason = classify_failure(res.returncode, res.signal, False, res.stderr,
                                                   rss_peak_mib=res.rss_peak_mib, crash=res.crash)
            return Measurement(outcome, reason=reason, metrics=res.crash.as_metrics() if res.crash else {},
                               **common)
        metrics = {**result.pop("metrics"), **huge_pages_metrics(config, res.huge_pages_peak_mib)}
        return Measurement(**result, metrics=metrics, **common)


def wait_healthy(proc: IsolatedProcess, client: Client) -> float:
    """Seconds from start until /health answers 200; ServerGone if the process exits first, TimeoutError at the
    client's deadline."""
    started = time.monotonic()
    while True:
        if not proc.running:
            raise ServerGone("llama-server exited before it was ready")
        if time.monotonic() >= client.deadline:
            raise TimeoutError("llama-server was not ready before its deadline")
        try:
            if client.get_status("/health") == 200:
                return time.monotonic() - started
        except (OSError, http.client.HTTPException):
            pass  # not listening yet
        time.sleep(_POLL_S)


def _measure(proc: IsolatedProcess, client: Client, config: TrialConfig, ctx: RunContext) -> dict[str, Any]:
    """Warm-up, then the measured rounds; returns the Measurement fields."""
    startup_s = wait_healthy(proc, client)
    parallel = slots(config)
    prompts = prompt_tokens(client, config.n_prompt, config.repetitions * parallel + 1)
    client.complete(prompts[-1][: _WARMUP_TOKENS[0]], _WARMUP_TOKENS[1])
    tg: list[float] = []
    pp: list[float] = []
    rounds: list[dict[str, Any]] = []
    engine_s = 0.0
    outcome, reason = Outcome.OK, ""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for rep in range(config.repetitions):
            batch = prompts[rep * parallel:(rep + 1) * parallel]
            started = time.monotonic()
            done = list(pool.map(lambda p: client.complete(p, config.n_gen), batch))
            wall = time.monotonic() - started
            engine_s += wall
            generated = sum(int(c.timings.get("predicted_n", 0)) for c in done)
            rounds.append({"wall_s": wall, "aggregate_tg_wall": generated / wall if wall > 0 else None,
                           "requests": [{"ttft_ms": c.ttft_ms, "wall_ms": c.wall_ms, **c.timings} for c in done]})
            if config.n_gen > 0:
                tg.append(sum(float(c.timings["predicted_per_second"]) for c in done))
            if config.n_prompt > 0:
                pp.append(sum(float(c.timings["prompt_per_second"]) for c in done))
            first = tg[-1] if tg else pp[-1]
            if rep == 0 and ctx.on_first_sample is not None and ctx.on_first_sample(first):
                outcome, reason = Outcome.PRUNED, f"first repetition ({first:.2f} tok/s) cannot beat the best"
                break
    ttfts = [r["ttft_ms"] for rnd in rounds for r in rnd["requests"] if r["ttft_ms"] is not None]
    metrics = {"startup_s": startup_s, "parallel": parallel, "ttft_ms": ttfts,
               "ttft_ms_median": statistics.median(ttfts) if ttfts else None,
               "prompt_tokens": [r["prompt_n"] for rnd in rounds for r in rnd["requests"]]}
    return dict(outcome=outcome, reason=reason, tg_samples=tuple(tg), pp_samples=tuple(pp), engine_s=engine_s,
                raw_output=json.dumps(rounds, indent=1), metrics=metrics)
