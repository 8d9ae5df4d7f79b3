"""Storage URLs: which kind of storage a URL names and the driver autoinfer opens it with."""

from __future__ import annotations

from autoinfer.errors import UserError
from autoinfer.store.redact import redact_url

MEMORY_STORAGE = "memory"  # a study that lives only in this process (offline replays of search strategies)


def is_shared(url: str) -> bool:
    """A storage several workers may use at once."""
    return url.split(":", 1)[0].split("+", 1)[0] == "postgresql"


def driver_url(url: str) -> str:
    """postgresql://… with the driver autoinfer installs (psycopg2; SQLAlchemy 2.1 defaults to psycopg 3)."""
    return "postgresql+psycopg2:" + url.split(":", 1)[1] if url.split(":", 1)[0] == "postgresql" else url


def check_url(url: str) -> None:
    """SQLite (one worker per study), PostgreSQL (many) or the in-process memory storage; nothing else."""
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if url != MEMORY_STORAGE and scheme not in ("sqlite", "postgresql"):
        raise UserError(f"storage {redact_url(url)!r}: autoinfer coordinates workers on PostgreSQL; use postgresql://USER@HOST/DB "
                        "for several workers or sqlite:///FILE for one")
