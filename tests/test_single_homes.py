"""The model's architecture and llama.cpp's placement rules each have one implementation: every other module asks
model/arch.py or model/placement.py instead of repeating a rule under another name."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoinfer"


def _found(pattern: re.Pattern[str], home: str) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
            for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).as_posix() != home
            for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


# The attention-layer rule, and reading architecture numbers out of GGUF metadata keys.
ARCHITECTURE = re.compile(r"%\s*(interval|self\.full_attention_interval|full_attention_interval)\b"
                          r"|recurrent_layers\b|[\"'](\{arch\}|qwen35moe)?\.?(attention\.head_count|ssm\.state_size|"
                          r"expert_used_count|block_count)[\"']")


def test_the_architecture_is_read_in_one_place():
    found = _found(ARCHITECTURE, "model/arch.py")
    assert not found, "\n".join(found)


# The first GPU layer (n_layers + 1 - n_gpu_layers), and writing or splitting `regex=BUFFER` tensor overrides.
PLACEMENT = re.compile(r"n_layers\s*\+\s*1\s*-|=CPU\b|=CUDA|rpartition\(\s*[\"']=[\"']\s*\)")


def test_the_placement_rules_live_in_one_module():
    found = _found(PLACEMENT, "model/placement.py")
    assert not found, "\n".join(found)
