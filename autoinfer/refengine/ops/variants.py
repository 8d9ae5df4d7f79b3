"""Lookup by name in an op's variant registry (ops/gdn, ops/moe)."""

from __future__ import annotations

from typing import TypeVar

from autoinfer.errors import UserError

Fn = TypeVar("Fn")


def pick(op: str, variants: dict[str, Fn], name: str) -> Fn:
    """variants[name]; an unknown name is a UserError that lists the known ones."""
    if name not in variants:
        raise UserError(f"{op} variant {name!r} is not one of {', '.join(variants)}")
    return variants[name]
