"""What a quantized file costs in fidelity: KL divergence and perplexity against the highest-precision file.

llama-perplexity runs the reference once on a text corpus and saves its token distributions
(--kl-divergence-base), then scores every other file against them (--kl-divergence). Results go to a JSON
sidecar per model file under cache_dir()/quality/, keyed by the file's content hash, so a sweep reads them back
instead of measuring again. The numbers mean something only for real weights: the synthetic stand-ins have
random weights, whose near-uniform outputs make KLD tiny; there it only orders the types by precision.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from autoinfer.errors import UserError
from autoinfer.llama.binaries import Tools
from autoinfer.llama.build import find_tools
from autoinfer.llama.quantize import DEFAULT_CORPUS, file_sha256
from autoinfer.llama.smoke import repack_off_args
from autoinfer.model.gguf_info import read_info
from autoinfer.paths import cache_dir

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_PM = r"\s*(?:±|\+/-)\s*"
_FINAL_PPL = re.compile(rf"Final estimate: PPL = {_NUM}{_PM}{_NUM}")
_MEAN_PPL_Q = re.compile(rf"Mean PPL\(Q\)\s*:\s*{_NUM}{_PM}{_NUM}")
_MEAN_PPL_BASE = re.compile(rf"Mean PPL\(base\)\s*:\s*{_NUM}{_PM}{_NUM}")
_MEAN_KLD = re.compile(rf"Mean\s+KLD:\s*{_NUM}{_PM}{_NUM}")
_SAME_TOP = re.compile(rf"Same top p:\s*{_NUM}{_PM}{_NUM}\s*%")
_TIMEOUT_S = 4 * 3600
#: llama-perplexity runs per measurement at most, when its summary went missing (see _measured): on the tiny model
#: 24 of 80 runs lost it on a loaded 2-core host, so 4 runs left about one measurement in 120 without one and a
#: test measuring four files failed; 10 leave about one in 170,000.
_RUNS = 10


@dataclass(frozen=True)
class QualitySettings:
    """How quality is measured; part of the sidecar key, since another corpus or context gives other numbers."""

    corpus: Path = DEFAULT_CORPUS
    ctx: int = 256
    chunks: int | None = None  # None: every chunk the corpus holds
    threads: int | None = None
    n_gpu_layers: int | None = None  # None: llama-perplexity's own default (fit to the device)

    def key(self, reference_sha: str) -> str:
        return f"ref={reference_sha[:16]} corpus={file_sha256(self.corpus)[:16]} ctx={self.ctx} chunks={self.chunks}"


@dataclass(frozen=True)
class Quality:
    """Fidelity of one file relative to the reference file (the reference itself has kld 0 by definition)."""

    kld: float  # mean KL divergence per token, nats
    kld_err: float
    ppl: float
    ppl_err: float
    reference_ppl: float
    same_top_p: float | None  # % of tokens whose most likely token matches the reference's
    reference: str  # path of the reference file
    key: str
    measured_at: str


def parse_reference_ppl(text: str) -> tuple[float, float]:
    """PPL and its error from a llama-perplexity run ("Final estimate: PPL = 8.1234 +/- 0.05")."""
    match = _FINAL_PPL.search(text)
    if match is None:
        raise ValueError("no 'Final estimate: PPL = …' line in llama-perplexity output")
    return float(match.group(1)), float(match.group(2))


def parse_kld(text: str) -> dict[str, float | None]:
    """Mean KLD, PPL(Q), PPL(base) and same-top-p from a --kl-divergence run."""
    found: dict[str, float | None] = {}
    for name, pattern in (("kld", _MEAN_KLD), ("ppl", _MEAN_PPL_Q), ("reference_ppl", _MEAN_PPL_BASE)):
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"no {pattern.pattern.split('(')[0].strip()!r} line in llama-perplexity output")
        found[name], found[f"{name}_err"] = float(match.group(1)), float(match.group(2))
    top = _SAME_TOP.search(text)
    found["same_top_p"] = float(top.group(1)) if top else None
    return found


def sidecar_path(model: Path) -> Path:
    folder = cache_dir() / "quality"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{file_sha256(model)}.json"


def load_quality(model: Path, key: str | None = None) -> Quality | None:
    """The stored quality of a file for a measurement key; with key=None, the most recent one."""
    path = sidecar_path(model)
    if not path.is_file():
        return None
    entries = json.loads(path.read_text()).get("entries", {})
    if key is not None:
        return Quality(**entries[key]) if key in entries else None
    latest = max(entries.values(), key=lambda e: e["measured_at"], default=None)
    return Quality(**latest) if latest else None


def _store(model: Path, quality: Quality) -> None:
    path = sidecar_path(model)
    data = json.loads(path.read_text()) if path.is_file() else {"file": str(model), "entries": {}}
    data["entries"][quality.key] = asdict(quality)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def reference_of(models: list[Path]) -> Path:
    """The highest-precision file: most weight bytes per weight (the files are quantizations of one model)."""
    def bits_per_weight(path: Path) -> float:
        info = read_info(path)
        weights = [t for t in info.tensors if len(t.shape) >= 2]
        n = sum(_elements(t.shape) for t in weights)
        return 8 * sum(t.n_bytes for t in weights) / n

    return max(models, key=bits_per_weight)


def _elements(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def measure_quality(models: list[Path], settings: QualitySettings = QualitySettings(), *,
                    reference: Path | None = None, tools: Tools | None = None, force: bool = False,
                    on_result: Callable[[Path, Quality, bool], None] | None = None) -> dict[Path, Quality]:
    """Quality of every file against `reference` (default: the highest-precision one). Cached per file."""
    models = [Path(m).resolve() for m in models]
    if not Path(settings.corpus).is_file():
        raise UserError(f"corpus {settings.corpus} does not exist; pass a UTF-8 text file with --corpus")
    reference = Path(reference).resolve() if reference else reference_of(models)
    key = settings.key(file_sha256(reference))
    results: dict[Path, Quality] = {}
    todo = []
    for model in dict.fromkeys([reference, *models]):
        cached = None if force else load_quality(model, key)
        if cached is not None:
            results[model] = cached
            if on_result:
                on_result(model, cached, True)
        else:
            todo.append(model)
    if not todo:
        return {m: results[m] for m in models}
    tools = tools or find_tools()
    scratch = Path(tempfile.mkdtemp(prefix="kld-", dir=cache_dir()))
    try:
        logits = scratch / "reference.kld"
        ref_ppl, ref_err = _measured(parse_reference_ppl, tools, reference, settings,
                                     ["--kl-divergence-base", str(logits)])
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for model in todo:
            if model == reference:
                quality = Quality(0.0, 0.0, ref_ppl, ref_err, ref_ppl, 100.0, str(reference), key, now)
            else:
                q = _measured(parse_kld, tools, model, settings,
                              ["--kl-divergence-base", str(logits), "--kl-divergence"])
                quality = Quality(q["kld"], q["kld_err"], q["ppl"], q["ppl_err"], q["reference_ppl"],
                                  q["same_top_p"], str(reference), key,
                                  datetime.now(timezone.utc).isoformat(timespec="seconds"))
            _store(model, quality)
            results[model] = quality
            if on_result:
                on_result(model, quality, False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {m: results[m] for m in models}


def _measured(parser: Callable[[str], object], tools: Tools, model: Path, settings: QualitySettings,
              extra: list[str]):
    """Run llama-perplexity and parse its summary, running it again when the summary is missing after a clean exit.

    llama.cpp logs through a background thread that is not drained at exit: a run that finishes quickly (a tiny
    model) can end with status 0 before its last lines reach the pipe (0c1e570: about one run in three on the tiny
    model). The run is deterministic, so repeating it measures the same thing.
    """
    for _ in range(_RUNS - 1):
        text = _perplexity(tools, model, settings, extra)
        try:
            return parser(text)
        except ValueError:
            continue
    return _parsed(parser, _perplexity(tools, model, settings, extra), model)


def _parsed(parser: Callable[[str], object], text: str, model: Path):
    try:
        return parser(text)
    except ValueError as exc:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise UserError(f"llama-perplexity on {model.name}: {exc} ({tail})") from None


def _perplexity(tools: Tools, model: Path, settings: QualitySettings, extra: list[str]) -> str:
    argv = [str(tools.tool("llama-perplexity")), "-m", str(model), "-c", str(settings.ctx),
            "-b", str(settings.ctx)]
    if "--kl-divergence" not in extra:  # the scoring run reads its tokens from the saved logits file
        argv += ["-f", str(settings.corpus)]
    if settings.chunks:
        argv += ["--chunks", str(settings.chunks)]
    if settings.threads:
        argv += ["-t", str(settings.threads)]
    if settings.n_gpu_layers is not None:
        argv += ["-ngl", str(settings.n_gpu_layers)]
    argv += [*extra, *repack_off_args(tools, "llama-perplexity")]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"llama-perplexity on {model.name} ran past {_TIMEOUT_S} s") from None
    text = done.stdout + done.stderr
    if done.returncode != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise UserError(f"llama-perplexity failed on {model.name} (exit {done.returncode}): {tail}")
    return text
