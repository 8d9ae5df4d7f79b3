"""The configuration of one trial: what the search proposes, the memory and performance models read, and every
engine turns into its own invocation. It sits below engines/ and model/ so both can use it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

#: Load modes whose weights in RAM are the model file's mapped pages: llama.cpp then never puts them in a host buffer
#: (llama-model-loader: "avoid using a host buffer when using mmap"), so `--no-host` and huge pages do not move them.
MAPPED_LOAD_MODES = frozenset({"mmap", "mmap+mlock"})


@dataclass(frozen=True)
class TrialConfig:
    """One configuration to measure. Field names are the parameter names of campaign files.

    `override_tensors` holds llama.cpp tensor-override patterns ("regex=BUFFER"), one per entry, in the order
    llama.cpp applies them (first match wins). `extra` holds knobs only some engines have (reference-engine
    device/dtype, llama-bench priority and CPU mask, server slots), sorted by name so configs hash and compare.
    """

    model: Path
    n_gpu_layers: int = 99
    n_cpu_moe: int = 0
    override_tensors: tuple[str, ...] = ()
    threads: int | None = None
    batch: int = 2048
    ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    load_mode: str = "mmap"
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 3
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        object.__setattr__(self, "override_tensors", tuple(self.override_tensors))
        object.__setattr__(self, "extra", tuple(sorted(dict(self.extra).items())))

    def get(self, name: str, default: Any = None) -> Any:
        """An engine-specific knob from `extra`."""
        return dict(self.extra).get(name, default)

    def host_weights_unpinned(self) -> bool:
        """huge_pages=1 with a load mode that reads the file: llama.cpp's `--no-host` keeps the weights in RAM in
        malloc'd memory instead of the driver's pinned buffers (engines/llama_common.py HUGE_PAGES)."""
        return wants_huge_pages(self) and self.load_mode not in MAPPED_LOAD_MODES

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls)) - {"extra"}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "TrialConfig":
        """Build from flat parameters: known field names go to fields, the rest to `extra`."""
        known = cls.field_names()
        core = {k: v for k, v in params.items() if k in known}
        extra = {k: v for k, v in params.items() if k not in known}
        if "override_tensors" in core and isinstance(core["override_tensors"], str):
            core["override_tensors"] = tuple(p for p in core["override_tensors"].split(";") if p)
        return cls(**core, extra=tuple(extra.items()))

    def to_params(self) -> dict[str, Any]:
        """Flat JSON-friendly parameters; the inverse of from_params."""
        out = {k: v for k, v in asdict(self).items() if k != "extra"}
        out["model"] = str(self.model)
        out["override_tensors"] = list(self.override_tensors)
        out.update(dict(self.extra))
        return out

    def with_(self, **changes: Any) -> "TrialConfig":
        return replace(self, **changes)


def wants_huge_pages(config: TrialConfig) -> bool:
    """huge_pages=1 (engines/llama_common.py HUGE_PAGES): its trials also record how much of the process was on huge
    pages."""
    value = config.get("huge_pages")
    return value is not None and bool(int(value))
