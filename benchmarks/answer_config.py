"""The configuration a benchmark re-measures: an `autoinfer export --format json` answer, or the `ours` side of one
budget in a vs_fit.py result (benchmarks/results/vs-fit-*.json), read the same way by every script that takes one."""

from __future__ import annotations

import json
from pathlib import Path

from autoinfer.engines.base import TrialConfig


def load_answer(path: Path, budget: float | None) -> TrialConfig:
    """The answer's configuration; a ValueError naming the problem and the fix for a file that holds none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}; give `autoinfer export --format json` output") from None
    if isinstance(data, list):
        if budget is None:
            raise ValueError(f"{path} is a vs_fit.py result: name one of its budgets with --budget")
        matches = [e["ours"] for e in data if e["budget_mib"] == budget]
        if not matches:
            have = ", ".join(f"{e['budget_mib']:g}" for e in data)
            raise ValueError(f"{path} has no budget {budget:g}: it has {have}")
        return TrialConfig.from_params(matches[0])
    if not isinstance(data, dict) or "config" not in data:
        raise ValueError(f"{path} has no \"config\": give `autoinfer export --format json` output")
    return TrialConfig.from_params(data["config"])
