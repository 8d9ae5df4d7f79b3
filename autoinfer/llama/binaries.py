"""Locate llama.cpp tools and learn what they are: commit, CUDA or not, which flags their --help lists.

Lookup order: an explicit folder, $AUTOINFER_LLAMA_BIN, builds cached by `autoinfer build`, then PATH. Flags change
between llama.cpp versions, so engines ask `help_flags()` instead of assuming a flag exists.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from autoinfer.errors import UserError

ENV_VAR = "AUTOINFER_LLAMA_BIN"
TOOL_NAMES = ("llama-bench", "llama-server", "llama-cli", "llama-perplexity", "llama-quantize", "llama-fit-params",
              "llama-imatrix")
_VERSION_RE = re.compile(r"version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+([0-9A-Za-z._+-]+)\)")
_FLAG_RE = re.compile(r"(--?[A-Za-z][\w.-]*)(,\s*|\s+|$)")
_BRACKET_FLAG_RE = re.compile(r"\[(--?[A-Za-z][\w.-]*)")


@dataclass(frozen=True)
class Tools:
    """One llama.cpp build: where its binaries and shared libraries are, and what it was built from."""

    bin_dir: Path
    lib_dir: Path | None
    commit: str
    flags: tuple[str, ...]
    cuda: bool
    #: The smoke run (autoinfer.llama.smoke) found weight repacking crashes this build: engines turn it off.
    repack_off: bool = False
    decision: str = ""  # the smoke run's decision in words, when it changed how the build is used

    def tool(self, name: str) -> Path:
        """Path of one binary (e.g. "llama-bench"); a UserError names the tool when this build lacks it."""
        path = self.bin_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(
                f"{name} is not in {self.bin_dir}; rebuild with `autoinfer build` or point --llama-bin at a folder "
                f"that has it"
            )
        return path

    def help_flags(self, name: str) -> frozenset[str]:
        """Every flag the binary's --help lists (both spellings, e.g. "-ngl" and "--n-gpu-layers")."""
        path = self.tool(name)
        return _help_flags(path, path.stat().st_mtime_ns)

    def env(self) -> dict[str, str]:
        """Variables that let llama-cpp-python load this build's libllama instead of compiling its own."""
        return {"LLAMA_CPP_LIB_PATH": str(self.lib_dir)} if self.lib_dir else {}


@functools.lru_cache(maxsize=64)
def _help_flags(path: Path, mtime_ns: int) -> frozenset[str]:
    """Parse `--help` once per binary version (the mtime is part of the cache key)."""
    text = _run_text([str(path), "--help"])
    return parse_help_flags(text)


def parse_help_flags(text: str) -> frozenset[str]:
    """Flags from llama.cpp help text: the option column of each line ("-m, --model <f>") and "[--flag]" usage."""
    flags: set[str] = set(_BRACKET_FLAG_RE.findall(text))
    for line in text.splitlines():
        rest = line.strip()
        while match := _FLAG_RE.match(rest):
            flags.add(match.group(1))
            if "," not in match.group(2):
                break
            rest = rest[match.end():]
    return frozenset(flags)


def _run_text(argv: list[str]) -> str:
    """stdout+stderr of a short informational call (--help, --version); llama.cpp prints these on either stream."""
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot run {argv[0]} ({exc}); check that it is a working llama.cpp binary") from exc
    return done.stdout + done.stderr


def user_tools(folder: Path) -> Tools:
    """Describe binaries the user built: commit from `--version`, CUDA from the libraries or the binary itself."""
    bin_dir = Path(folder).expanduser().resolve()
    if not bin_dir.is_dir():
        raise UserError(f"llama.cpp binary folder {bin_dir} does not exist; pass --llama-bin DIR holding llama-bench")
    present = [name for name in TOOL_NAMES if (bin_dir / name).is_file()]
    if not present:
        raise UserError(
            f"{bin_dir} has none of {', '.join(TOOL_NAMES)}; pass the folder that holds the llama.cpp binaries"
        )
    probe = bin_dir / present[0]
    match = _VERSION_RE.search(_run_text([str(probe), "--version"]))
    if match is None:
        raise UserError(f"`{probe} --version` did not print a llama.cpp build line; is it a llama.cpp binary?")
    lib_dir = next((d for d in (bin_dir, bin_dir.parent / "lib", bin_dir.parent / "lib64")
                    if (d / "libllama.so").exists()), None)
    return Tools(bin_dir=bin_dir, lib_dir=lib_dir, commit=match.group(2), flags=(), cuda=_has_cuda(probe, lib_dir))


def _has_cuda(binary: Path, lib_dir: Path | None) -> bool:
    """A shared build ships libggml-cuda.so; a static one carries the CUDA backend's symbols in the binary."""
    if lib_dir is not None and any(lib_dir.glob("libggml-cuda.so*")):
        return True
    with binary.open("rb") as handle:
        tail = b""
        while chunk := handle.read(1 << 22):
            if b"ggml_backend_cuda" in tail + chunk:
                return True
            tail = chunk[-32:]
    return False
