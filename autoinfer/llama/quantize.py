"""The quantization axis: one high-precision GGUF → a ladder of quantized files made with llama-quantize.

Each rung is cached under cache_dir()/models/ladder/<source hash>/ (or a folder the user names), written to a
temporary name and renamed when complete, so an interrupted run never leaves a half file that looks finished.
The campaign sweeps the ladder through its `model:` list; `autoinfer model quality` measures what each rung
costs in fidelity (see autoinfer.llama.quality). The very-low-bit types need an importance matrix: `imatrix="auto"`
makes one with llama-imatrix on the shipped corpus, cached under cache_dir()/imatrix/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from autoinfer import atomic
from autoinfer.errors import UserError
from autoinfer.llama.binaries import Tools
from autoinfer.llama.build import find_tools
from autoinfer.llama.smoke import repack_off_args
from autoinfer.model.gguf_info import read_info
from autoinfer.paths import cache_dir

#: The shipped text corpus: calibration for importance matrices and the quality check's perplexity/KLD.
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus-en.txt"

DEFAULT_TYPES = ("Q8_0", "Q6_K", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ2_M", "IQ2_XXS")
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
_TYPE_LINE = re.compile(r"^\s*\d+\s+or\s+([A-Z0-9_]+)\s*:", re.MULTILINE)
_NEEDS_IMATRIX = "will require an imatrix"
_QUANTIZE_TIMEOUT_S = 4 * 3600
IMATRIX_AUTO = "auto"
_IMATRIX_CTX = 512  # llama-imatrix's own default; it needs two contexts of text, the shipped corpus holds five


@dataclass(frozen=True)
class Rung:
    """One file of the ladder."""

    qtype: str
    path: Path
    n_bytes: int
    built: bool  # False: reused from the cache
    imatrix: Path | None = None  # the importance matrix this ladder gives the type (--imatrix FILE, or auto)


def quant_types(tools: Tools) -> tuple[str, ...]:
    """The type names this llama-quantize accepts, read from its --help (they change between versions)."""
    text = _run([str(tools.tool("llama-quantize")), "--help"], timeout_s=60).stdout
    names = tuple(dict.fromkeys(_TYPE_LINE.findall(text)))
    if not names:
        raise UserError(f"{tools.tool('llama-quantize')} --help lists no quantization types; is it llama-quantize?")
    return names


def parse_types(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """'Q8_0,q4_k_m' → ('Q8_0', 'Q4_K_M'); a UserError names an unknown type and lists the known ones."""
    wanted = tuple(dict.fromkeys(t.strip().upper() for t in text.split(",") if t.strip()))
    if not wanted:
        raise UserError("--types is empty; give a comma-separated list such as Q8_0,Q4_K_M")
    unknown = [t for t in wanted if t not in allowed]
    if unknown:
        raise UserError(f"--types: unknown quantization type {unknown[0]!r}; llama-quantize knows {', '.join(allowed)}")
    return wanted


def file_sha256(path: Path) -> str:
    """Content hash of a model file, memoised per (path, size, mtime) in the cache so a 20 GB file is read once."""
    path = Path(path).resolve()
    stat = path.stat()
    memo_dir = cache_dir() / "hashes"
    memo_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = memo_dir / f"{key}.json"
    if memo.is_file():
        try:
            known = json.loads(memo.read_text())["sha256"]
            if isinstance(known, str) and len(known) == 64:
                return known
            raise ValueError("not a sha256")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            print(f"warning: hash cache entry {memo} is damaged ({exc}); hashing {path} again", file=sys.stderr)
            memo.unlink(missing_ok=True)
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    atomic.write_text(memo, json.dumps({"path": str(path), "sha256": digest.hexdigest()}))
    return digest.hexdigest()


def weight_types(path: Path) -> frozenset[str]:
    """ggml types of the file's matrices (tensors of two or more dimensions)."""
    return frozenset(t.ggml_type for t in read_info(path).tensors if len(t.shape) >= 2)


def rung_path(source: Path, qtype: str, out_dir: Path | None, imatrix: Path | None) -> Path:
    """Where a rung lives: the folder is keyed by the source's content (and the imatrix), the name by the type."""
    if out_dir is None:
        key = file_sha256(source)[:16] + (f"-im{file_sha256(imatrix)[:8]}" if imatrix else "")
        out_dir = cache_dir() / "models" / "ladder" / key
    return Path(out_dir) / f"{source.stem}-{qtype}.gguf"


def needs_imatrix(tools: Tools, source: Path, qtype: str) -> bool:
    """Ask llama-quantize itself (--dry-run writes nothing): the very-low-bit types need an importance matrix."""
    done = _run([str(tools.tool("llama-quantize")), "--dry-run", str(source), qtype], timeout_s=600)
    return _NEEDS_IMATRIX in done.stdout + done.stderr


def auto_imatrix(source: Path, *, tools: Tools, threads: int | None = None) -> Path:
    """An importance matrix of `source` from the real llama-imatrix on the shipped corpus, cached by (model hash,
    corpus hash): a ladder re-run, or another ladder of the same file, reuses it instead of another calibration
    pass over the whole model."""
    source = Path(source).resolve()
    if read_info(source).metadata.get("tokenizer.ggml.model", "none") == "none":  # llama-imatrix would abort
        raise UserError(f"{source.name} has no tokenizer, so llama-imatrix cannot read the corpus; pass --imatrix "
                        "FILE, or use a model with one (`autoinfer model synth --tokenizer qwen35`)")
    name = f"{file_sha256(source)[:16]}-{file_sha256(DEFAULT_CORPUS)[:16]}-c{_IMATRIX_CTX}.gguf"
    target = cache_dir() / "imatrix" / name
    if not target.is_file():
        argv = [str(tools.tool("llama-imatrix")), "-m", str(source), "-f", str(DEFAULT_CORPUS),
                "-c", str(_IMATRIX_CTX), "--no-ppl", *repack_off_args(tools, "llama-imatrix"), "-o"]
        _write_atomically(argv, ["-t", str(threads)] if threads else [], target, f"llama-imatrix on {source.name}")
    return target


def build_ladder(source: Path, types: tuple[str, ...], *, out_dir: Path | None = None,
                 imatrix: Path | Literal["auto"] | None = None, allow_requantize: bool = False,
                 threads: int | None = None, tools: Tools | None = None,
                 on_rung: Callable[[Rung], None] | None = None) -> list[Rung]:
    """Quantize `source` to every type in `types` (cached). Checks everything before writing anything.

    imatrix="auto" gives the types that need an importance matrix one from auto_imatrix; the other types are made
    without it, so they are the same cached files as in a ladder without --imatrix.
    """
    source = Path(source).resolve()
    tools = tools or find_tools()
    known = quant_types(tools)
    types = parse_types(",".join(types), known)
    auto = imatrix == IMATRIX_AUTO
    if imatrix is not None and not auto and not Path(imatrix).is_file():
        raise UserError(f"--imatrix {imatrix} does not exist; pass an existing file, or --imatrix auto to make one")
    quantized = weight_types(source) - FLOAT_TYPES
    if quantized and not allow_requantize:
        raise UserError(
            f"{source} already holds quantized weights ({', '.join(sorted(quantized))}); quantize from an "
            "F16/BF16/F32 file, or pass --allow-requantize to accept the extra loss"
        )
    matrix_of = dict.fromkeys(types, None if auto else imatrix)
    if imatrix is None or auto:
        missing = [t for t in types if not rung_path(source, t, out_dir, None).is_file()
                   and needs_imatrix(tools, source, t)]
        if missing and not auto:
            raise UserError(
                f"{', '.join(missing)} need an importance matrix: pass --imatrix auto (made with llama-imatrix) or "
                "--imatrix FILE, or leave these types out"
            )
        if missing:
            matrix_of.update(dict.fromkeys(missing, auto_imatrix(source, tools=tools, threads=threads)))
    rungs = []
    for qtype in types:
        matrix = matrix_of[qtype]
        target = rung_path(source, qtype, out_dir, matrix)
        built = not target.is_file()
        if built:
            _quantize(tools, source, target, qtype, imatrix=matrix, allow_requantize=allow_requantize,
                      threads=threads)
        rung = Rung(qtype, target, target.stat().st_size, built, matrix)
        rungs.append(rung)
        if on_rung is not None:
            on_rung(rung)
    return rungs


def _quantize(tools: Tools, source: Path, target: Path, qtype: str, *, imatrix: Path | None,
              allow_requantize: bool, threads: int | None) -> None:
    argv = [str(tools.tool("llama-quantize"))]
    if imatrix is not None:
        argv += ["--imatrix", str(imatrix)]
    if allow_requantize:
        argv.append("--allow-requantize")
    argv.append(str(source))
    _write_atomically(argv, [qtype, *([str(threads)] if threads else [])], target, f"llama-quantize for {qtype}")


def _write_atomically(head: list[str], tail: list[str], target: Path, what: str) -> None:
    """Run `head PARTIAL tail`, then rename the partial file to `target`: an interrupted run leaves no file that
    looks finished. The partial name keeps the .gguf suffix, from which llama-imatrix picks its output format."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}.{os.getpid()}.partial{target.suffix}")
    try:
        done = _run([*head, str(partial), *tail], timeout_s=_QUANTIZE_TIMEOUT_S)
        if done.returncode != 0 or not partial.is_file():
            last = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise UserError(f"{what} failed (exit {done.returncode}): {last}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _run(argv: list[str], *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"{Path(argv[0]).name} ran past {timeout_s:.0f} s; check the machine's load") from None
    except OSError as exc:
        raise UserError(f"cannot run {argv[0]}: {exc.strerror}") from None
