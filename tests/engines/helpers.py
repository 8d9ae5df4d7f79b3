"""Builders of the engine tests' trial configurations and run contexts."""

from __future__ import annotations

from pathlib import Path

from autoinfer.engines.base import RunContext, TrialConfig


def trial(model: Path, **kw) -> TrialConfig:
    """A small CPU trial (32 prompt and 8 generated tokens, 2 repetitions, 2 threads); `kw` overrides any field."""
    base = {"n_prompt": 32, "n_gen": 8, "repetitions": 2, "threads": 2, "n_gpu_layers": 0}
    return TrialConfig(model, **{**base, **kw})


def context(tmp_path: Path, timeout_s: float = 120) -> RunContext:
    return RunContext(timeout_s=timeout_s, artifacts=tmp_path)
