"""README's test command and CI run the same thing: CI executes README's line verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_readmes_test_command_verbatim():
    install, test = _readme_commands()[:2]
    assert install.startswith("pip install -e . && autoinfer sweep")
    assert "pytest" in test and "torch==" in test and "whl/cpu" in test
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert ci_lines[-1] == test
    assert sum("pip install" in line and "torch" in line for line in ci_lines) == 1  # no second, different torch
