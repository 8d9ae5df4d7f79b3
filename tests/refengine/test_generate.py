"""`autoinfer engine generate`: text from the reference engine with a configuration's flags, tokenized by the GGUF's
own tokenizer; what it prints is the engine's greedy continuation, and bad input is one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoinfer.model.synth import cached_model
from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.generate import load_tokenizer, prompt_ids, tokens
from autoinfer.refengine.options import EngineOptions

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()", "engine", "generate"]
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def model():
    return cached_model("tiny", "F16")  # with the Qwen3.5 tokenizer the synthesizer ships


@pytest.fixture(scope="module")
def engine(model):
    return ReferenceEngine.from_gguf(model, EngineOptions())


def _greedy(engine, ids: list[int], n: int) -> list[int]:
    logits, state = engine.prefill(ids)
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = engine.decode(out[-1], state)
    return out


def test_the_command_prints_the_engines_greedy_continuation_and_its_speed(model, engine):
    tokenizer = load_tokenizer(model)
    ids = tokenizer(PROMPT)["input_ids"]
    expected = _greedy(engine, ids, 6)
    done = subprocess.run([*CLI, "--model", str(model), "--prompt", PROMPT, "--n-predict", "6", "--ignore-eos"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    assert f"prompt: {len(ids)} tokens in " in done.stderr and "generated: 6 tokens, " in done.stderr


def test_sampling_follows_its_seed_and_the_end_token_stops(model, engine):
    tokenizer = load_tokenizer(model)
    ids = prompt_ids(tokenizer, PROMPT, chat=False)
    a, b, c = (list(tokens(engine, ids, 8, 1.0, seed, set())) for seed in (3, 3, 4))
    assert a == b and a != c
    first = _greedy(engine, ids, 1)[0]
    assert list(tokens(engine, ids, 8, 0.0, 0, {first})) == [first]


def test_chat_wraps_the_prompt_in_the_gguf_template(model):
    tokenizer = load_tokenizer(model)
    chat = prompt_ids(tokenizer, PROMPT, chat=True)
    assert chat == list(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                                       add_generation_prompt=True, tokenize=True, return_dict=False))
    assert len(chat) > len(prompt_ids(tokenizer, PROMPT, chat=False))


def test_a_prompt_repeated_to_a_measurements_length(model):
    done = subprocess.run([*CLI, "--model", str(model), "--prompt", PROMPT, "--prompt-tokens", "50", "--n-predict",
                           "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "prompt: 50 tokens in " in done.stderr, done.stderr


@pytest.mark.parametrize("args, words", [
    (["--prompt", "x", "--n-predict", "5000"], "exceed max_context 4096; raise --max-context"),
    (["--prompt", "x", "--prompt-tokens", "0"], "--prompt-tokens 0: give at least 1"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "x", "--gdn", "bogus"], "gdn variant 'bogus' is not one of"),
])
def test_bad_input_is_one_line_and_exit_2(model, args, words):
    done = subprocess.run([*CLI, "--model", str(model), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_a_model_without_a_tokenizer_or_file_is_one_line_and_exit_2(tmp_path):
    bare = cached_model("tiny", "F16", tokenizer="none")
    for path, words in ((bare, "carries no tokenizer"), (tmp_path / "nope.gguf", "does not exist")):
        done = subprocess.run([*CLI, "--model", str(path), "--prompt", "x"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr

