"""A build is done when it runs: llama-bench on the tiny synthetic model, once per weight type autoinfer uses.

A build that compiles can still die on the first matrix product: on a cloud VM whose CPU advertises AMX, a
`-march=native` build of llama.cpp 0c1e570 dies with SIGILL in its AMX kernels for repacked quantized weights,
while F16 weights and `--repack 0` run. So every build is smoke-run before it is trusted, per weight type, with
weight repacking on (llama.cpp's default); a type that crashes is run again with `--repack 0`. The verdict:
- ok: every type runs as built;
- repack_off: some crash with repacking and all run without it, so every engine that has the knob runs with repack
  off (a visible decision, recorded here, on the study and on every trial's configuration);
- broken: some crash even without repacking; llama.build then rebuilds without the failing CPU feature;
- unverified: some fail without a crash (a build too old to load the tiny qwen35moe model): it is used as it is,
  and the decision says so.
The record is kept beside the build's build.json (smoke.json), or under cache_dir()/smoke/ for binaries the user
built, and is re-made when the binary changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from autoinfer.llama.binaries import Tools
from autoinfer.measure.process import run_isolated
from autoinfer.model.synth import cached_model
from autoinfer.paths import cache_dir

#: Weight types the shipped campaigns and the tests run through llama.cpp (tests/llama/test_smoke.py checks that
#: every type they name is here): F16 (quantization source), Q8_0 (synth default), Q4_0, Q4_K (the 35B campaign),
#: Q5_K/Q6_K/Q2_K (what the quantization ladder writes). Each has its own repacked/AMX path in ggml-cpu.
SMOKE_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K")
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
RECORD = "smoke.json"
#: Bump when SMOKE_TYPES or the procedure change: older records are re-made.
VERSION = 1
_TIMEOUT_S = 120
_BENCH_ARGS = ("-p", "8", "-n", "4", "-r", "1", "-ngl", "0", "-o", "json")


@dataclass(frozen=True)
class TypeRun:
    """One smoke run: a weight type with repacking on (1) or off (0)."""

    qtype: str
    repack: int
    ok: bool
    reason: str = ""  # why it failed: the crash explained, or the exit status and stderr line
    signal: str | None = None  # "SIGILL" when a signal ended it
    component: str | None = None  # the faulting function/library, when stderr or the kernel log shows it
    wall_s: float = 0.0


@dataclass(frozen=True)
class SmokeRecord:
    """The smoke verdict of one build: every run, the verdict and the decision it leads to, in words."""

    binary: str
    binary_id: str
    version: int
    runs: tuple[TypeRun, ...]
    verdict: str  # "ok" | "repack_off" | "broken" | "unverified"
    decision: str
    at: float

    @property
    def repack_off(self) -> bool:
        return self.verdict == "repack_off"

    @property
    def failures(self) -> tuple[TypeRun, ...]:
        """The runs that failed with nothing left to try (repack off failed too, or had no flag to try)."""
        fixed = {r.qtype for r in self.runs if r.ok}
        return tuple(r for r in self.runs if not r.ok and r.qtype not in fixed)

    def summary(self) -> str:
        """`F16 ok, Q8_0 SIGILL → ok with --repack 0, …`: one entry per weight type."""
        parts = []
        for qtype in dict.fromkeys(r.qtype for r in self.runs):
            runs = [r for r in self.runs if r.qtype == qtype]
            words = []
            for r in runs:
                what = "ok" if r.ok else (r.signal or "failed")
                words.append(what if r.repack == 1 else f"{what} with --repack 0")
            parts.append(f"{qtype} " + " → ".join(words))
        return ", ".join(parts)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SmokeRecord:
        data = json.loads(text)
        data["runs"] = tuple(TypeRun(**r) for r in data["runs"])
        return cls(**data)


def record_path(tools: Tools) -> Path:
    """Beside build.json for a build autoinfer made; under cache_dir()/smoke/ for the user's own binaries."""
    build_dir = tools.bin_dir.parent
    if (build_dir / "build.json").is_file():
        return build_dir / RECORD
    folder = cache_dir() / "smoke"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{hashlib.sha256(str(tools.bin_dir).encode()).hexdigest()[:16]}.json"


def binary_id(path: Path) -> str:
    """Changes when the binary is rebuilt or replaced: size and modification time."""
    st = path.stat()
    return f"{st.st_size}-{st.st_mtime_ns}"


def load(tools: Tools) -> SmokeRecord | None:
    """The record of this exact binary, or None (never smoked, rebuilt since, older procedure, unreadable)."""
    path = record_path(tools)
    bench = tools.bin_dir / "llama-bench"
    if not path.is_file() or not bench.is_file():
        return None
    try:
        record = SmokeRecord.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # a damaged record is made again, never trusted
    if record.version != VERSION or record.binary_id != binary_id(bench):
        return None
    return record


def repack_off_args(tools: Tools, binary: str) -> list[str]:
    """`--no-repack` for a llama.cpp tool with the common arguments (llama-perplexity, llama-imatrix) when the
    build's smoke run found that repacking crashes it; nothing otherwise or when the tool lacks the flag."""
    record = load(tools)
    if not (tools.repack_off or (record is not None and record.repack_off)):
        return []
    flags = tools.help_flags(binary)
    return [flag for flag in ("--no-repack", "-nr") if flag in flags][:1]


def _run(tools: Tools, model: Path, qtype: str, repack: int | None) -> TypeRun:
    bench = tools.tool("llama-bench")
    argv = [str(bench), "-m", str(model), "-t", str(min(4, os.cpu_count() or 1)), *_BENCH_ARGS]
    if repack is not None:
        argv += ["--repack", str(repack)]
    env = dict(os.environ)
    if tools.lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(tools.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
    res = run_isolated(argv, timeout_s=_TIMEOUT_S, env=env)
    shown = 1 if repack is None else repack
    if res.returncode == 0 and not res.timed_out and '"avg_ts"' in res.stdout:
        return TypeRun(qtype, shown, True, wall_s=round(res.wall_s, 2))
    if res.crash is not None:
        return TypeRun(qtype, shown, False, res.crash.describe(), res.crash.name, res.crash.component,
                       round(res.wall_s, 2))
    lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
    why = "timed out" if res.timed_out else f"exit status {res.returncode}"
    return TypeRun(qtype, shown, False, f"{why}: {lines[-1] if lines else 'no output'}", wall_s=round(res.wall_s, 2))


def run(tools: Tools, types: tuple[str, ...] = SMOKE_TYPES) -> SmokeRecord:
    """Smoke-run every weight type (a crash with repacking is tried again with --repack 0), store and return the
    record."""
    has_repack = "--repack" in tools.help_flags("llama-bench")
    runs: list[TypeRun] = []
    for qtype in types:
        model = cached_model("tiny", qtype)
        first = _run(tools, model, qtype, None)
        runs.append(first)
        if not first.ok and first.signal and has_repack and qtype not in FLOAT_TYPES:
            runs.append(_run(tools, model, qtype, 0))
    record = _verdict(tools, tuple(runs))
    path = record_path(tools)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)
    return record


def _verdict(tools: Tools, runs: tuple[TypeRun, ...]) -> SmokeRecord:
    bench = tools.bin_dir / "llama-bench"
    failed_on = [r for r in runs if not r.ok and r.repack == 1]
    rescued = {r.qtype for r in runs if r.ok and r.repack == 0}
    left = [r for r in failed_on if r.qtype not in rescued]
    if not failed_on:
        verdict, decision = "ok", "every weight type runs as built"
    elif not left:
        first = failed_on[0]
        verdict = "repack_off"
        decision = (f"weight repacking crashes this build ({', '.join(r.qtype for r in failed_on)}: {first.reason}) "
                    "and every type runs with it off: every engine that has the knob runs with repack off "
                    "(llama-bench --repack 0, llama-server --no-repack)")
    elif not any(r.signal for r in left):
        verdict = "unverified"
        decision = (f"the smoke run could not run {', '.join(r.qtype for r in left)} ({left[0].reason}), without a "
                    "crash; the build is used as it is, and trials on such models will show why they fail")
    else:
        verdict = "broken"
        decision = (f"{', '.join(r.qtype for r in left)} fail even with repack off ({left[0].reason}); "
                    "this build cannot be used as it is")
    return SmokeRecord(binary=str(bench), binary_id=binary_id(bench), version=VERSION, runs=runs,
                       verdict=verdict, decision=decision, at=time.time())
