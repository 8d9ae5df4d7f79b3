"""Fixtures of the llama.cpp engine tests: the engine a test module names in ENGINE, and a model with a tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoinfer.engines.base import create


@pytest.fixture(scope="module")
def engine(request, llama_tools):
    """The engine named by the test module's ENGINE, on the CPU build, checked."""
    e = create(request.module.ENGINE, llama_bin=llama_tools.bin_dir)
    e.check()
    return e


@pytest.fixture(scope="module")
def chat_model() -> Path:
    """The tiny model with a real (qwen35) tokenizer, for the engines that tokenize text."""
    from autoinfer.model.synth import cached_model

    return cached_model("tiny", "Q8_0", tokenizer="qwen35")
