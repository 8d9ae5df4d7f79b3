"""Outside engines/, no engine name is compared and no engine is probed: engines declare what they can do
(engines/base.py: CAPABILITIES by name, and the Engine base class with a default for every capability)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoinfer"
ENGINE_NAMES = re.compile(r"""(==|!=|\bin\b|\bnot in\b)\s*[\(\[{]?\s*["'](llama-bench|llama-server|llama-cpp-python|replay|reference)["']""")


def test_no_engine_name_is_compared_outside_engines():
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if "engines" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text().splitlines(), 1) if ENGINE_NAMES.search(line)]
    assert not found, "\n".join(found)


PROBES = re.compile(r"\b(getattr|hasattr)\(\s*(self\.|ctx\.)?engine\s*,")


def test_no_engine_is_probed_for_a_capability():
    """Every capability has a declared default on engines.base.Engine; callers use it directly."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if "engines" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text().splitlines(), 1) if PROBES.search(line)]
    assert not found, "\n".join(found)
