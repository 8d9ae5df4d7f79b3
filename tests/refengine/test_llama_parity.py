"""The engine against llama.cpp (llama-server, CPU build) on the same GGUF: greedy tokens and top log-probs.

llama-server takes the prompt as token ids and returns, per generated token, its top-n log-probabilities
(n_probs), so both sides see the same ids and no tokenizer is involved. llama.cpp runs F32 files in f32 (KV cache
f32 here), and F16 files by converting activations to f16 for each matmul; the bounds below are on the absolute
difference of log-probabilities, i.e. the relative error of the probabilities themselves.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request

import pytest

from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.options import EngineOptions

N_GEN, N_PROBS = 20, 5
LOGPROB_BOUND = {"F32": 5e-3, "F16": 5e-2}  # measured: 1.7e-3 and 1.9e-2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, payload: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def llama_server_greedy(tools, model, prompt: list[int]) -> list[dict]:
    from autoinfer.measure.process import IsolatedProcess

    port = free_port()
    argv = [tools.tool("llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "512",
            "-t", "1", "-np", "1", "-ctk", "f32", "-ctv", "f32", "--no-warmup"]
    env = dict(os.environ)
    if tools.lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(tools.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
    with IsolatedProcess(argv, env=env) as server:
        deadline = time.monotonic() + 60
        while True:
            assert server.running, f"llama-server exited: {server.output()[1][-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy in 60 s"
            time.sleep(0.2)
        out = post(port, {"prompt": prompt, "n_predict": N_GEN, "n_probs": N_PROBS, "temperature": 0,
                          "cache_prompt": False, "ignore_eos": True})
    return out["completion_probabilities"]


@pytest.fixture(scope="module", params=["F32", "F16"])
def gguf_file(request, hf_model, tmp_path_factory):
    from hf_gguf import write_gguf

    return request.param, write_gguf(hf_model, tmp_path_factory.mktemp("llama") / f"tiny-{request.param}.gguf",
                                     request.param)


@pytest.mark.slow
def test_greedy_tokens_and_logprobs_match_llama_server(llama_tools, gguf_file, prompt):
    kind, path = gguf_file
    steps = llama_server_greedy(llama_tools, path, prompt[:100])
    assert len(steps) == N_GEN

    engine = ReferenceEngine.from_gguf(path, EngineOptions())
    logits, state = engine.prefill(prompt[:100])
    worst = 0.0
    for step in steps:
        logprobs = logits[-1].log_softmax(-1)
        ours = int(logprobs.argmax())
        assert ours == step["id"], "greedy token differs from llama.cpp"
        for top in step["top_logprobs"]:
            worst = max(worst, abs(float(logprobs[top["id"]]) - top["logprob"]))
        logits = engine.decode(step["id"], state)
    assert worst <= LOGPROB_BOUND[kind], f"max |Δ logprob| {worst:.2e} over {N_GEN} steps × top {N_PROBS}"
