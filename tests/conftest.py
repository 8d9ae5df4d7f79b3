"""Session fixtures: the real llama.cpp CPU tools (built once per machine, cached) and tiny synthetic models."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_tools():
    """The CPU llama.cpp build; the first test session on a machine builds it (about 6 minutes on 2 cores)."""
    from autoinfer.llama.build import find_tools

    return find_tools(build_if_missing=True)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny random-weight qwen35moe GGUF (cached per machine)."""
    from autoinfer.model.synth import cached_model

    return cached_model("tiny", "Q8_0")


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """Every test writes its studies under its own results folder."""
    monkeypatch.setenv("AUTOINFER_RESULTS", str(tmp_path / "results"))
