"""Where autoinfer keeps things: a per-machine cache (builds, synthetic models) and per-campaign results."""

from __future__ import annotations

import os
from pathlib import Path

#: The storage URL handed to `autoinfer worker` processes (never on their command line: `ps` shows argv to all).
STORAGE_ENV = "AUTOINFER_STORAGE"


def cache_dir() -> Path:
    """Per-machine cache shared by every checkout: llama.cpp builds and synthetic models are paid for once."""
    root = os.environ.get("AUTOINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autoinfer"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir() -> Path:
    """Campaign outputs: ./results unless AUTOINFER_RESULTS says otherwise."""
    return Path(os.environ.get("AUTOINFER_RESULTS", "results")).absolute()


def default_storage() -> str:
    """The SQLite file that holds every study unless --storage names another."""
    path = results_dir() / "autoinfer.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def trial_dir(study: str, number: int) -> Path:
    """Artifacts of one trial: command, stdout, stderr, raw engine output."""
    path = results_dir() / study / "trials" / str(number)
    path.mkdir(parents=True, exist_ok=True)
    return path
