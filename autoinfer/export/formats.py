"""The recommended configuration in the forms people paste: shell commands (POSIX-quoted) and data files."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from autoinfer.campaign.store import Best, samples_of
from autoinfer.engines.llama_common import bench_args, server_args
from autoinfer.errors import UserError

FORMATS = ("server", "bench", "json", "yaml")
#: Engines whose configurations are llama.cpp configurations (a replay table is made from llama.cpp runs).
LLAMA_ENGINES = frozenset({"llama-bench", "llama-server", "llama-cpp-python", "replay"})


def _binary(best: Best, name: str) -> str:
    """The binary next to the one the trial ran, so the pasted command uses the same build."""
    cmd = best.trial.user_attrs.get("engine_cmd") or []
    if cmd and Path(cmd[0]).name.startswith("llama-"):
        return str(Path(cmd[0]).with_name(name))
    return name


def as_dict(best: Best, study: str) -> dict:
    t = best.trial
    return {
        "study": study,
        "trial": t.number,
        "objective": best.value,
        "params": dict(t.params),
        "config": best.config.to_params(),
        "tg_samples": samples_of(t, "tg"),
        "pp_samples": samples_of(t, "pp"),
        "vram_peak_mib": t.user_attrs.get("vram_peak_mib"),
        "rss_peak_mib": t.user_attrs.get("rss_peak_mib"),
        "confirmed": best.confirmation,  # interleaved re-measurement and its test; None when not confirmed
    }


def render(fmt: str, best: Best, study: str, engine: str = "llama-bench") -> str:
    if fmt in ("server", "bench") and engine not in LLAMA_ENGINES:
        raise UserError(f"study {study!r} measured the {engine} engine, whose settings are not a llama.cpp command "
                        "line; use --format json or yaml")
    if fmt == "server":
        return shlex.join([_binary(best, "llama-server"), *server_args(best.config)])
    if fmt == "bench":
        return shlex.join([_binary(best, "llama-bench"), *bench_args(best.config)])
    data = as_dict(best, study)
    if engine in LLAMA_ENGINES:
        data["llama_server"] = [_binary(best, "llama-server"), *server_args(best.config)]
        data["llama_bench"] = [_binary(best, "llama-bench"), *bench_args(best.config)]
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)
