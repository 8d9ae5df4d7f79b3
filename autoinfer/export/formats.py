"""The recommended configuration in the forms people paste: shell commands (POSIX-quoted), a llama-cpp-python
snippet and data files."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from autoinfer.engines.base import TrialConfig, capabilities
from autoinfer.engines.llama_common import bench_args, env_words, server_args
from autoinfer.engines.reference import generate_command
from autoinfer.errors import UserError
from autoinfer.store.trials import Best

FORMATS = ("server", "bench", "python", "generate", "json", "yaml")
#: Engines whose configurations are llama.cpp configurations (a replay table is made from llama.cpp runs).


def _binary(best: Best, name: str) -> str:
    """The binary next to the one the trial ran, so the pasted command uses the same build."""
    cmd = best.trial.engine_cmd
    if cmd and Path(cmd[0]).name.startswith("llama-"):
        return str(Path(cmd[0]).with_name(name))
    return name


def server_command(best: Best) -> list[str]:
    """The llama-server argv that runs the configuration as measured, an environment its knobs set first."""
    return [*env_words(best.config), _binary(best, "llama-server"), *server_args(best.config)]


def bench_command(best: Best) -> list[str]:
    """The llama-bench argv of the configuration, an environment its knobs set first."""
    return [*env_words(best.config), _binary(best, "llama-bench"), *bench_args(best.config)]


def as_dict(best: Best, study: str) -> dict:
    t = best.trial
    return {
        "study": study,
        "trial": t.number,
        "objective": best.value,
        "params": dict(t.params),
        "config": best.config.to_params(),
        "tg_samples": t.samples("tg"),
        "pp_samples": t.samples("pp"),
        "vram_peak_mib": t.vram_peak_mib,
        "rss_peak_mib": t.rss_peak_mib,
        # interleaved re-measurement and its test; None when not confirmed
        "confirmed": best.confirmation.to_attr() if best.confirmation is not None else None,
    }


def python_snippet(best: Best, study: str, engine: str) -> str:
    """`llm = Llama(...)` with the keyword arguments the llama-cpp-python engine passes (its own llama_kwargs).

    Llama() silently ignores keywords it does not know, so a knob it has no keyword for fails the export instead
    of vanishing from the snippet; so does flash_attn "auto" measured by another engine: Llama() takes only on or
    off, and the snippet would run something other than what was measured.
    """
    from autoinfer.engines.llama_cpp_python import LlamaCppPythonEngine, llama_kwargs

    config = best.config
    unset = TrialConfig(config.model).to_params()
    lacking = [f"{name}={value!r}" for name, value in config.to_params().items()
               if name not in LlamaCppPythonEngine.knobs and value != unset.get(name)]
    if config.flash_attn == "auto" and not capabilities(engine).python_settings:
        lacking.append("flash_attn='auto'")
    if lacking:
        raise UserError(f"trial {best.trial.number} of study {study!r} sets {', '.join(lacking)}, which "
                        "llama_cpp.Llama() cannot express; use --format server or bench")
    try:
        kwargs = llama_kwargs(config)
    except UserError as exc:
        raise UserError(f"trial {best.trial.number} of study {study!r}: {exc}") from None
    notes = {"type_k": f"ggml_type {config.type_k}", "type_v": f"ggml_type {config.type_v}",
             "n_ctx": "the campaign's serve.context (counted in a memory budget it sets)" if config.get("ctx_size") else
             "the context the measurement used: set serve.context in the campaign to size the budget for a longer one"}
    lines = [f"# autoinfer: study {study!r}, trial {best.trial.number} ({engine}), objective {best.value:.4g}",
             "from llama_cpp import Llama", ""]
    repack = config.get("repack")
    if repack is not None and not int(repack):  # Llama() has no keyword for it: set it where Llama() starts from
        lines += ["import llama_cpp.llama_cpp as bindings", "", "_defaults = bindings.llama_model_default_params", "",
                  "", "def _without_repack():  # weight repacking off, as measured (llama_model_params.use_extra_bufts)",
                  "    params = _defaults()", "    params.use_extra_bufts = False", "    return params", "", "",
                  "bindings.llama_model_default_params = _without_repack", ""]
    lines.append("llm = Llama(")
    for name, value in kwargs.items():
        note = f"  # {notes[name]}" if name in notes else ""
        lines.append(f"    {name}={value!r},{note}")
    return "\n".join([*lines, ")"]) + "\n"


def render(fmt: str, best: Best, study: str, engine: str = "llama-bench") -> str:
    own = capabilities(engine).own_command and best.trial.engine_cmd
    if fmt == "bench" and own:  # the engine's own command, exactly as the trial ran it
        return shlex.join(own)
    if fmt == "generate":
        if not capabilities(engine).generates:
            raise UserError(f"study {study!r} measured the {engine} engine, which has no generate command; "
                            "use --format server (llama-server generates text)")
        return shlex.join(generate_command(best.config))
    if fmt in ("server", "bench", "python") and not capabilities(engine).llama_settings:
        raise UserError(f"study {study!r} measured the {engine} engine, whose settings are not llama.cpp settings; "
                        f"use --format {'bench (its own command), ' if own else ''}json or yaml")
    if fmt == "python":
        return python_snippet(best, study, engine)
    if fmt == "server":
        return shlex.join(server_command(best))
    if fmt == "bench":
        return shlex.join(bench_command(best))
    data = as_dict(best, study)
    if capabilities(engine).llama_settings:
        data["llama_server"] = server_command(best)
        data["llama_bench"] = bench_command(best)
    elif own:
        data["command"] = list(own)
    if capabilities(engine).generates:
        data["generate"] = generate_command(best.config)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)
