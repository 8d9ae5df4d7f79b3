"""Property-based fuzzing of every parser family: mutations of a valid input are accepted or refused with one
line (UserError), never another exception. A short run for CI; benchmarks/fuzz.py runs 10,000+ per family."""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path

import pytest
from families import FAMILIES, check, gguf_parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("AUTOINFER_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """A valid input with byte flips, cuts, insertions of hostile tokens, or arbitrary bytes."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        pos = draw(st.integers(0, max(len(data), 1)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([
                b"NaN", b"Infinity", b"-1", b".inf", b"null", b"true", b"9" * 400, b"\xff\xfe", b"\x00",
                b"[" * 600, b"{", b'"', b",", b"\t", b"\n", b"&a [*a]", b"<<: *x", b"1e999", b"0x" + b"f" * 40,
            ]))
        elif op == "dup" and data:
            data[pos:pos] = bytes(data[max(0, pos - 40):pos])
    if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=512))
    return bytes(data)


@pytest.fixture(scope="module")
def tiny_gguf() -> tuple[bytes, bytes]:
    """The default tiny model split into its header (mutated) and its tensor data (kept)."""
    return gguf_parts()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family(name, tiny_gguf):
    func, seed = FAMILIES[name]
    head, tail = tiny_gguf if name.startswith("GGUF") else (seed, b"")
    if tail:
        func = partial(func, data_bytes=len(tail))

    @SETTINGS
    @given(mutated(head))
    def prop(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            check(func, data, Path(tmp))

    prop()
