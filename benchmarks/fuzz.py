"""The long fuzz run: N mutated inputs per parser family (default 10,000), each with a 5 s limit; prints a table of
inputs, uncaught exceptions (by type) and hangs per family. The property is the one tests/fuzz checks in CI: an
input is accepted or refused with UserError (one line), nothing else.

    PYTHONPATH=. python benchmarks/fuzz.py --inputs 10000
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))
from families import FAMILIES, check, gguf_parts  # noqa: E402

TOKENS = [b"NaN", b"Infinity", b"-1", b".inf", b"null", b"true", b"9" * 400, b"\xff\xfe", b"\x00", b"[" * 600,
          b"{", b'"', b",", b"\t", b"\n", b"&a [*a]", b"<<: *x", b"1e999", b"0x" + b"f" * 40, b"\xff" * 8]


class Hang(Exception):
    pass


def mutate(rng: random.Random, seed: bytes) -> bytes:
    if rng.random() < 0.05:
        return rng.randbytes(rng.randint(0, 512))
    data = bytearray(seed)
    for _ in range(rng.randint(1, 6)):
        pos = rng.randint(0, len(data))
        op = rng.choice(("flip", "cut", "insert", "dup", "int"))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = rng.randint(0, 255)
        elif op == "cut":
            del data[pos:pos + rng.randint(1, 64)]
        elif op == "insert":
            data[pos:pos] = rng.choice(TOKENS)
        elif op == "dup":
            data[pos:pos] = bytes(data[max(0, pos - 40):pos])
        elif op == "int" and len(data) >= 8:  # a little-endian count or dimension set to an extreme
            p = min(pos, len(data) - 8)
            data[p:p + 8] = rng.choice((0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)).to_bytes(8, "little")
    return bytes(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="", help="comma-separated substrings of family names (default: all)")
    args = ap.parse_args()
    head, tail = gguf_parts()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Hang()))
    rows = []
    for name, (func, seed) in FAMILIES.items():
        if args.families and not any(f in name for f in args.families.split(",")):
            continue
        if name.startswith("GGUF"):
            func, seed = partial(func, data_bytes=len(tail)), head
        rng = random.Random(f"{args.seed}:{name}")
        errors: Counter[str] = Counter()
        hangs = 0
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.inputs):
                data = mutate(rng, seed)
                signal.alarm(5)
                try:
                    check(func, data, Path(tmp))
                except Hang:
                    hangs += 1
                except Exception as exc:  # noqa: BLE001 - what the run counts
                    errors[type(exc).__name__] += 1
                finally:
                    signal.alarm(0)
        rows.append((name, args.inputs, sum(errors.values()), dict(errors), hangs, time.monotonic() - started))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print("| family | inputs | uncaught exceptions | types | hangs > 5 s | wall s |")
    print("|---|---|---|---|---|---|")
    for name, n, bad, types, hangs, wall in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in types.items()) or "-"
        print(f"| {name} | {n} | {bad} | {kinds} | {hangs} | {wall:.0f} |")


if __name__ == "__main__":
    main()
