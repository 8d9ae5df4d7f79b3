"""The llama-cpp-python engine: measures what `llama_cpp.Llama(**kwargs)` gives, one child process per trial.

The C++ is compiled once: by default the child loads the libllama of the llama.cpp build the other engines use
(LLAMA_CPP_LIB_PATH, from `autoinfer build`), so the three llama.cpp engines run the same code. The Python package
is the installed `llama_cpp` if there is one, else the pure-Python `llama_cpp` folder of the pinned
llama-cpp-python sdist (copied once under cache_dir()/python/), which needs no compiler.

`Llama()` has no tensor overrides and no n_cpu_moe, and ignores unknown keyword arguments silently, so this
engine declares only the knobs it really passes; a campaign asking for expert placement fails validation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from autoinfer.engines.base import Measurement, Outcome, RunContext, TrialConfig, register
from autoinfer.engines.knobs import BENCH_KNOBS, FLAG, TRIAL_KNOBS, choice, count
from autoinfer.engines.llama_common import LlamaToolsEngine, classify_failure, server_context
from autoinfer.errors import UserError
from autoinfer.measure.process import run_isolated
from autoinfer.paths import cache_dir

CHILD_MODULE = "autoinfer.engines.llama_cpp_python_child"
_LOAD_MODES = {"mmap": (True, False), "none": (False, False), "mlock": (False, True), "mmap+mlock": (True, True)}
#: The TrialConfig fields Llama() can express, and the knobs it has beyond them.
KNOBS = {**{name: knob for name, knob in TRIAL_KNOBS.items() if name not in ("n_cpu_moe", "override_tensors")},
         "load_mode": choice(*_LOAD_MODES), "threads_batch": count(), "op_offload": FLAG, "offload_kqv": FLAG,
         "ctx_size": count(), "repack": BENCH_KNOBS["repack"]}
#: ggml_type enum values (stable ABI; the bindings lack GGML_TYPE_BF16).
_GGML_TYPE_IDS = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}


def llama_kwargs(config: TrialConfig) -> dict[str, Any]:
    """The keyword arguments of `llama_cpp.Llama` for a configuration; UserError for what Llama() cannot express.

    flash_attn "auto" becomes False: Llama() takes a bool and defaults to off.
    """
    if config.n_cpu_moe or config.override_tensors:
        raise UserError("llama-cpp-python's Llama() has no n_cpu_moe or tensor overrides; use engine llama-bench "
                        "or llama-server for expert placement")
    if config.load_mode not in _LOAD_MODES:
        raise UserError(f"load_mode {config.load_mode!r}: Llama() offers only {', '.join(_LOAD_MODES)}")
    use_mmap, use_mlock = _LOAD_MODES[config.load_mode]
    kwargs: dict[str, Any] = {
        "model_path": str(config.model), "n_gpu_layers": config.n_gpu_layers, "n_batch": config.batch,
        "n_ubatch": config.ubatch, "n_ctx": server_context(config), "type_k": _GGML_TYPE_IDS[config.type_k],
        "type_v": _GGML_TYPE_IDS[config.type_v], "flash_attn": config.flash_attn == "on",
        "use_mmap": use_mmap, "use_mlock": use_mlock, "verbose": True,
    }
    if config.threads is not None:
        kwargs["n_threads"] = config.threads
        kwargs["n_threads_batch"] = config.get("threads_batch", config.threads)
    for name in ("op_offload", "offload_kqv"):
        if config.get(name) is not None:
            kwargs[name] = bool(config.get(name))
    return kwargs


def sdist_package() -> Path:
    """A folder holding the pure-Python `llama_cpp` package of the pinned sdist (copied once, atomically)."""
    from autoinfer.llama.build import SDIST_DIR, pinned_source

    target = cache_dir() / "python" / SDIST_DIR
    if (target / "llama_cpp" / "__init__.py").is_file():
        return target
    package = pinned_source().parents[1] / "llama_cpp"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".copy-", dir=target.parent))
    try:
        shutil.copytree(package, staging / "llama_cpp", ignore=shutil.ignore_patterns("server", "__pycache__"))
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@register("llama-cpp-python")
class LlamaCppPythonEngine(LlamaToolsEngine):
    """Measures `llama_cpp.Llama` in an isolated child process."""

    name = "llama-cpp-python"
    knobs = KNOBS

    def __init__(self, llama_bin: Path | str | None = None, library: str = "build") -> None:
        if library not in ("build", "package"):
            raise UserError(f"engine_options.library: {library!r} is not one of build, package")
        super().__init__(llama_bin)
        self._library = library
        self._env: dict[str, str] | None = None

    def child_env(self) -> dict[str, str]:
        """Environment of the child: which libllama it loads and where its Python package comes from."""
        if self._env is not None:
            return self._env
        env = dict(os.environ)
        installed = importlib.util.find_spec("llama_cpp") is not None
        if self._library == "build" or not installed:
            if self.tools.lib_dir is None:
                raise UserError(f"the llama.cpp build in {self.tools.bin_dir} has no shared libllama; rebuild it "
                                "with `autoinfer build`, or `pip install llama-cpp-python` and set "
                                "engine_options.library: package")
            env.update(self.tools.env())
        paths = [str(Path(__file__).resolve().parents[2])]
        if not installed:
            paths.insert(0, str(sdist_package()))
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        self._env = env
        return env

    def check(self) -> None:
        """Import llama_cpp in a child and load its library; UserError with the child's last line if it fails."""
        res = run_isolated([sys.executable, "-m", CHILD_MODULE, "--probe"], timeout_s=120, env=self.child_env())
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"llama-cpp-python cannot be loaded ({last}); install its dependencies with "
                            "`pip install 'autoinfer[python]'`")

    def batch_context(self, config: TrialConfig) -> int | None:
        return server_context(config)  # Llama() caps n_batch at n_ctx itself, as llama.cpp does

    def command(self, config: TrialConfig) -> list[str]:
        repack = config.get("repack", 0 if self.tools.repack_off else None)
        spec = {"kwargs": llama_kwargs(config), "n_prompt": config.n_prompt, "n_gen": config.n_gen,
                "repetitions": config.repetitions, "repack": None if repack is None else int(repack)}
        return [sys.executable, "-m", CHILD_MODULE, json.dumps(spec)]

    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        try:
            argv = self.command(config)
        except UserError as exc:
            return Measurement(Outcome.REJECTED, reason=str(exc))
        res = run_isolated(argv, timeout_s=ctx.timeout_s, env=self.child_env(), gpus=ctx.gpus)
        env = {"library": self._library, "lib_path": self.child_env().get("LLAMA_CPP_LIB_PATH"),
               "tools_commit": self.tools.commit, "vram_method": res.vram_method}
        common: dict[str, Any] = dict(engine_cmd=tuple(argv), wall_s=res.wall_s, stdout=res.stdout,
                                      stderr=res.stderr, vram_peak_mib=res.vram_peak_mib,
                                      vram_per_gpu_mib=res.vram_per_gpu_mib, rss_peak_mib=res.rss_peak_mib,
                                      raw_output=res.stdout)
        if res.returncode != 0 or res.timed_out:
            outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr,
                                               rss_peak_mib=res.rss_peak_mib, crash=res.crash)
            return Measurement(outcome, reason=reason, env=env, metrics=res.crash.as_metrics() if res.crash else {},
                               **common)
        try:
            result = json.loads(res.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            return Measurement(Outcome.BAD_OUTPUT, reason="the child exited 0 without its JSON result line",
                               env=env, **common)
        engine_s = sum(r.get("t_p_eval_ms", 0.0) + r.get("t_eval_ms", 0.0) for r in result["perf"]) / 1000
        metrics = {"load_s": result["load_s"], "llama_cpp_python": result["version"],
                   "flash_attn_used": "on" if config.flash_attn == "on" else "off"}
        return Measurement(Outcome.OK, tg_samples=tuple(result["tg"]), pp_samples=tuple(result["pp"]),
                           engine_s=engine_s, metrics=metrics,
                           env={**env, "library_loaded": result["library"], "system_info": result["system_info"]},
                           **common)
