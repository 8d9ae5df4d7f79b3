"""Model entries of a campaign or a command line → GGUF files on disk, checked before anything is stored."""

from __future__ import annotations

from pathlib import Path

from autoinfer.errors import UserError
from autoinfer.model.gguf_header import GGUFFormatError, read_header

GGUF_MAGIC = b"GGUF"
SYNTH_PREFIX = "synth:"  # "synth:tiny" or "synth:tiny/Q4_0": a synthetic model made (and cached) on first use


def resolve_model(entry: str) -> str:
    """A file path for a campaign model entry; `synth:PRESET[/QTYPE]` is synthesized once and cached."""
    if entry.startswith(SYNTH_PREFIX):
        from autoinfer.model.synth import cached_model

        preset, _, qtype = entry[len(SYNTH_PREFIX):].partition("/")
        return str(cached_model(preset, qtype or "Q8_0"))
    path = Path(entry)
    if not path.is_file():
        raise UserError(f"model file {entry} does not exist; fix the path under 'model:' or make one with "
                        "`autoinfer model synth`")
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise UserError(f"model file {entry} is not a GGUF file (bad magic); point 'model:' at a .gguf file")
    try:  # a half-copied file would only fail trial by trial as load_failed
        read_header(path)
    except GGUFFormatError as exc:
        raise UserError(f"model file {entry} is damaged: {exc}; copy or download it again") from None
    return str(path.resolve())


def resolve_models(entries: list[str]) -> dict[str, str]:
    return {entry: resolve_model(entry) for entry in entries}
