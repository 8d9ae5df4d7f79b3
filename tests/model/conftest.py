"""Running the real llama.cpp tools on synthetic models."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from autoinfer.measure.process import ProcessResult, run_isolated


@pytest.fixture(scope="session")
def tool_env(llama_tools) -> dict[str, str]:
    """Environment for the build's binaries (its shared libraries first on the search path)."""
    env = dict(os.environ)
    if llama_tools.lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(llama_tools.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
    return env


@pytest.fixture(scope="session")
def run_tool(llama_tools, tool_env) -> Callable[..., ProcessResult]:
    """run_tool("llama-bench", arg, ...) → ProcessResult; the child runs isolated with a timeout."""

    def run(name: str, *args: str, timeout_s: float = 120) -> ProcessResult:
        return run_isolated([llama_tools.tool(name), *args], timeout_s=timeout_s, env=tool_env)

    return run


@pytest.fixture(scope="session")
def bench(run_tool) -> Callable[[os.PathLike[str]], list[dict]]:
    """llama-bench -p 16 -n 4 -r 1 on one model → its JSON records (one for pp16, one for tg4)."""

    def run(model: os.PathLike[str]) -> list[dict]:
        result = run_tool("llama-bench", "-m", os.fspath(model), "-p", "16", "-n", "4", "-r", "1", "-t", "2",
                          "-o", "json")
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout)

    return run
