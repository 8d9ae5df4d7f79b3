"""What every llama.cpp engine shares: the verdict on a failed run, and TrialConfig → command-line flags.

Failure messages were checked against llama.cpp 0c1e570 (src/llama-context.cpp, src/llama-model-loader.cpp,
ggml/src/gguf.cpp, ggml/src/ggml-cuda/ggml-cuda.cu, ggml-alloc.c, tools/llama-bench). llama-bench hides every
llama.cpp log line unless run with -v, so its engine passes -v: without it a load that failed for lack of memory
and one that failed on a corrupt file both print only "failed to load model".
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal as signals
from pathlib import Path
from typing import Any, Iterable

from autoinfer.engines.base import Baseline, Decision, Engine, Outcome, TrialConfig
from autoinfer.engines.knobs import llama_preferred_values
from autoinfer.errors import UserError
from autoinfer.llama.build import working_tools
from autoinfer.measure.crash import Crash, signal_name
from autoinfer.measure.gpu import memory_used_mib, visible_gpus
from autoinfer.measure.host import usable_physical_cores
from autoinfer.measure.process import run_isolated
from autoinfer.trial_config import MAPPED_LOAD_MODES, wants_huge_pages

_REASON_CHARS = 240

# Ordered: within a rule the first pattern that matches a line gives the reason, so the most specific comes first.
_OOM = [
    r"cudaMalloc failed", r"\bout of memory\b", r"unable to allocate \S+ buffer", r"failed to allocate",
    r"std::bad_alloc", r"cudaErrorMemoryAllocation", r"CUBLAS_STATUS_ALLOC_FAILED", r"ErrorOutOfDeviceMemory",
    r"insufficient memory", r"Cannot allocate memory",
]
# Debug lines of runs that recovered (pinned memory and async-upload buffers fall back to plain host memory).
_OOM_BENIGN = re.compile(r"pinned memory|async uploads|retrying", re.IGNORECASE)
_LOAD = [
    r"error loading model", r"invalid magic", r"failed to open GGUF file", r"failed to read magic",
    r"gguf_init_from_\w+: ", r"unknown model architecture", r"not within the file bounds", r"failed to load model",
]
_REJECTED = [
    r"requires flash_attn", r"does not support different K", r"does not divide n_embd_head",
    r"invalid parameter for argument", r"unrecognized buffer type", r"\binvalid argument\b",
    r"unknown argument", r"error: invalid value", r"failed to create context",
]
# Words of error lines; whole words, so llama.cpp's "set_abort_callback" debug line does not count.
_TELLING = re.compile(r"error|assert|\babort(ed)?\b|fatal|terminate|exception|failed", re.IGNORECASE)
#: A SIGKILL while the tree held this share of the RAM limit is taken for the kernel's OOM killer.
OOM_KILL_RSS_SHARE = 0.85


def _short(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 1] + "…"


def _first_match(lines: list[str], patterns: list[str], skip: re.Pattern[str] | None = None) -> str | None:
    for pattern in patterns:
        rx = re.compile(pattern, re.IGNORECASE)
        for line in lines:
            if rx.search(line) and not (skip and skip.search(line)):
                return _short(line)
    return None


def telling_line(stderr: str) -> str:
    """The last line that looks like an error, else the last non-empty line."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _TELLING.search(line):
            return _short(line)
    return _short(lines[-1]) if lines else ""


def classify_failure(returncode: int | None, signal: int | None, timed_out: bool, stderr: str, *,
                     rss_peak_mib: float | None = None, ram_limit_mib: float | None = None,
                     crash: Crash | None = None) -> tuple[Outcome, str]:
    """The outcome of a llama.cpp run that did not succeed, and the stderr line that shows why. A death by a signal
    says what the signal means and, when `crash` found it, which component faulted."""
    lines = stderr.splitlines()
    if timed_out:
        return Outcome.TIMEOUT, "ran past the timeout; the process group was killed"
    for outcome, patterns, skip in ((Outcome.OOM, _OOM, _OOM_BENIGN), (Outcome.LOAD_FAILED, _LOAD, None),
                                    (Outcome.REJECTED, _REJECTED, None)):
        line = _first_match(lines, patterns, skip)
        if line:
            return outcome, line
    if signal == signals.SIGKILL and rss_peak_mib is not None:
        if ram_limit_mib is None:
            from autoinfer.measure.host import ram_limit_mib as limit

            ram_limit_mib = limit()
        if rss_peak_mib >= OOM_KILL_RSS_SHARE * ram_limit_mib:
            return Outcome.OOM, (f"killed by SIGKILL at a peak RSS of {rss_peak_mib:.0f} MiB of "
                                 f"{ram_limit_mib:.0f} MiB (the kernel's OOM killer)")
    last = telling_line(stderr)
    if crash is not None:
        return Outcome.CRASH, f"killed by {crash.describe()}" + (f"; last stderr line: {last}" if last else "")
    if signal is not None:
        return Outcome.CRASH, f"killed by {signal_name(signal)}" + (f": {last}" if last else "")
    return Outcome.CRASH, f"exit status {returncode}" + (f": {last}" if last else "")


# ---------------------------------------------------------------------------------------------- flag builders


def _check_patterns(patterns: Iterable[str], separators: str, where: str) -> None:
    for pattern in patterns:
        bad = [c for c in separators if c in pattern]
        if bad:
            raise UserError(
                f"override_tensors pattern {pattern!r} contains {bad[0]!r}, which {where} reads as a separator; "
                "rewrite the regex without it (e.g. [0-9] or alternatives in separate patterns)"
            )


FIT_LINE = re.compile(r"^-c\s+\d+\s+-ngl\s+(-?\d+)(.*)$")


def parse_fit_params(stdout: str) -> tuple[int, tuple[str, ...], str | None]:
    """`-c N -ngl N [-ts a,b] [-ot "p1,p2"]` (llama-fit-params' last line) → (n_gpu_layers, override patterns,
    tensor split as "a/b" or None)."""
    for line in reversed(stdout.strip().splitlines()):
        m = FIT_LINE.match(line.strip())
        if not m:
            continue
        rest = shlex.split(m.group(2))
        patterns: tuple[str, ...] = ()
        if "-ot" in rest:
            patterns = tuple(p for p in rest[rest.index("-ot") + 1].split(",") if p)
        split = rest[rest.index("-ts") + 1].replace(",", "/") if "-ts" in rest else None
        return int(m.group(1)), patterns, split
    raise ValueError("no '-c N -ngl N' line in llama-fit-params output")


class LlamaToolsEngine(Engine):
    """Base of the engines that run a llama.cpp build: looked up once, on first use, and built (once per machine,
    cached) when none is found, so a first `autoinfer sweep` on a fresh machine just works."""

    binary = "llama-bench"  # the tool check() requires

    def __init__(self, llama_bin: Path | str | None = None) -> None:
        self._llama_bin = Path(llama_bin) if llama_bin is not None else None
        self._tools: Any | None = None

    @property
    def tools(self) -> Any:
        """The build, smoke-run before first use (autoinfer.llama.build.working_tools)."""
        if self._tools is None:
            self._tools = working_tools(self._llama_bin)
        return self._tools

    def check(self) -> None:
        self.tools.tool(self.binary)

    def run_env(self, config: TrialConfig) -> dict[str, Any]:
        """What a trial records of how it ran: the build, and the environment its knobs set (knob_environment)."""
        knobs = knob_environment(config)
        return {"tools_commit": self.tools.commit, "tools_cuda": self.tools.cuda, "bin_dir": str(self.tools.bin_dir),
                **({"knob_environment": knobs} if knobs else {})}

    def decisions(self) -> tuple[Decision, ...]:
        """Repack off on a build whose smoke run crashed with weight repacking on."""
        if self.tools.repack_off and "repack" in self.knobs:
            return (Decision("repack", 0, self.tools.decision),)
        return ()

    def baseline(self, model: Path, budget_mib: float, n_ctx: int, batch: int, ubatch: int) -> Baseline | str:
        """llama-fit-params' placement when asked to leave (free − budget) MiB free on each GPU this worker sees,
        for the context and batch sizes the trials use."""
        if "override_tensors" not in self.knobs:
            return f"engine {self.name!r} takes no tensor overrides: no llama-fit-params baseline"
        gpus = visible_gpus()
        if not gpus:
            return "no GPU: no llama-fit-params baseline"
        margins = [int(g.memory_total_mib - (memory_used_mib(g.index) or 0.0) - budget_mib) for g in gpus]
        if min(margins) < 0:
            short = gpus[margins.index(min(margins))].index
            return f"GPU {short} has less free memory than the {budget_mib:.0f} MiB budget: no llama-fit-params baseline"
        argv = [str(self.tools.tool("llama-fit-params")), "-m", str(model), "-fitt", ",".join(map(str, margins)),
                "-c", str(n_ctx), "-fitc", str(n_ctx), "-b", str(batch), "-ub", str(ubatch)]
        result = run_isolated(argv, timeout_s=300)
        try:
            ngl, patterns, split = parse_fit_params(result.stdout)
        except ValueError:
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return f"llama-fit-params gave no answer (exit {result.returncode}): {tail[:200]}"
        return Baseline(ngl, patterns, split, shlex.join(argv))

    def preferred_values(self, device_budget: bool) -> dict[str, Any]:
        """llama_preferred_values, and with a device budget threads at one per physical core this process may use
        (llama.cpp's own default, llama_defaults, where nothing narrows the process's CPUs): the most that `threads:
        host` offers, where the GPU tables ran fastest (16 threads beat 8 on 175 of 180 configurations, 12 on 38 of 54;
        benchmarks/tables/h*-35b-*.csv), and what llama-fit-params' answers run. From the middle value, 12 of 16, an
        H100 sweep measured its first ten trials at 12 threads and gained 5% on moving to 16
        (benchmarks/results/vs-fit-h100.md, 6442b1d). A table replayed elsewhere keeps the middle: this host's cores say
        nothing of the table's."""
        preferred = llama_preferred_values(device_budget)
        return {**preferred, "threads": usable_physical_cores()} if device_budget else preferred

    def as_run(self, config: TrialConfig) -> TrialConfig:
        """Engine.as_run, and huge_pages=1 with a load mode that maps the file (MAPPED_LOAD_MODES) as 0: llama.cpp
        then keeps the weights in RAM as the file's pages and never in a host buffer (llama-model-loader: "avoid using
        a host buffer when using mmap"), so neither `--no-host` nor the tunable moves them; such a configuration is
        measured once, as what runs."""
        config = super().as_run(config)
        if wants_huge_pages(config) and config.load_mode in MAPPED_LOAD_MODES:
            return config.with_(extra=tuple((k, 0 if k == "huge_pages" else v) for k, v in config.extra))
        return config

    def refusal(self, config: TrialConfig) -> str | None:
        """Why llama.cpp would refuse this configuration at context creation, known without running it."""
        if config.flash_attn == "off" and config.type_v not in ("f16", "bf16", "f32"):
            return f"llama.cpp needs flash attention for a quantized V cache (type_v={config.type_v})"
        return None


class _Args:
    """Collects flags, checking each against the flags a binary lists in --help (None: assume all exist)."""

    def __init__(self, binary: str, supported: frozenset[str] | None) -> None:
        self.binary = binary
        self.supported = supported
        self.argv: list[str] = []

    def has(self, flag: str) -> bool:
        return self.supported is None or flag in self.supported

    def add(self, flag: str, value: Any, *, name: str, default: Any = None) -> None:
        """Add `flag value`; a missing flag is fine only when the value is llama.cpp's default anyway."""
        if self.has(flag):
            self.argv += [flag, value if isinstance(value, str) else str(value)]
        elif value != default:
            raise UserError(
                f"this {self.binary} build has no {flag} flag, needed for {name}={value!r}; "
                f"build a newer llama.cpp (`autoinfer build`) or drop {name} from the campaign"
            )


BENCH_EXTRAS = {"prio": "--prio", "cpu_mask": "-C", "cpu_strict": "--cpu-strict", "delay": "--delay",
                "poll": "--poll", "split_mode": "-sm", "tensor_split": "-ts", "main_gpu": "-mg", "repack": "--repack"}
#: Several GPUs (autoinfer.campaign.plan.multi_gpu_space); tensor_split is written "3/1" as llama-bench takes it.
MULTI_GPU_EXTRAS = {"split_mode": "-sm", "tensor_split": "-ts", "main_gpu": "-mg"}
#: llama.cpp defaults of the extras, so a build lacking the flag still runs a campaign that leaves them alone.
_BENCH_EXTRA_DEFAULTS = {"prio": 0, "cpu_mask": "0x0", "cpu_strict": False, "delay": 0, "poll": 50,
                         "split_mode": "layer", "tensor_split": None, "main_gpu": 0, "repack": 1}


#: huge_pages=1: llama.cpp's weights in host memory on transparent huge pages. glibc (2.35 and later) backs malloc's
#: large blocks with them where the kernel allows it (THP `madvise` or `always`); `--no-host` puts the weights in
#: such blocks on a CUDA build too, instead of the driver's pinned buffers, which malloc does not make. On an H200
#: host at the 8 GiB answer (experts of 27 layers in RAM, `-lm none`) generation ran 1.19 [1.07, 1.31] times as fast
#: as with mmap and 1.22 [1.11, 1.35] times as fast as pinned, 12.0 GiB of the process on huge pages; the prompt ran
#: as with mmap, 0.20x pinned (benchmarks/results/huge-pages.md). With mmap the weights are the file's pages,
#: which this does not change.
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def knob_environment(config: TrialConfig) -> dict[str, str]:
    """The environment variables a configuration sets for llama.cpp: knobs that are not command-line flags."""
    return dict(HUGE_PAGES) if wants_huge_pages(config) else {}


def env_words(config: TrialConfig) -> list[str]:
    """`env NAME=VALUE` before a printed command, for what knob_environment sets: pasted in a shell or run as an
    argv, the command then runs as it was measured."""
    env = knob_environment(config)
    return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []


def child_environment(config: TrialConfig, tools: Any) -> dict[str, str]:
    """This process's environment for a llama.cpp child: the build's libraries first on LD_LIBRARY_PATH and the
    configuration's knob_environment, a GLIBC_TUNABLES already set kept beside the tunable added."""
    env = dict(os.environ)
    if tools.lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(tools.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
    for name, value in knob_environment(config).items():
        env[name] = ":".join(v for v in (env.get(name), value) if v)
    return env


def huge_pages_metrics(config: TrialConfig, peak_mib: float | None) -> dict[str, float | None]:
    """A trial's `huge_pages_mib` metric where it asked for huge pages: the most of its process on them (None: the
    process ended before it was read)."""
    return {"huge_pages_mib": peak_mib} if wants_huge_pages(config) else {}


def bench_args(config: TrialConfig, tools: Any | None = None) -> list[str]:
    """llama-bench flags for one configuration (binary not included), ending in `-o json`.

    With `tools` (autoinfer.llama.binaries.Tools) only flags the binary lists in --help are used; without, the
    flags of the current llama.cpp are assumed (for exported commands).
    """
    supported = tools.help_flags("llama-bench") if tools is not None else None
    return bench_args_for(_repack_imposed(config, tools), supported)


def _repack_imposed(config: TrialConfig, tools: Any | None) -> TrialConfig:
    """A build whose smoke run needs repack off never runs with it on, whatever path the configuration took (a
    configuration stored before the decision, a drift anchor): the sweep also records it in the configuration."""
    if tools is not None and getattr(tools, "repack_off", False) and config.get("repack") is None:
        return config.with_(extra=(*config.extra, ("repack", 0)))
    return config


def _batch_cache_placement(a: _Args, config: TrialConfig) -> None:
    """The flags llama-bench and llama-server spell the same way."""
    a.add("-b", config.batch, name="batch", default=2048)
    a.add("-ub", config.ubatch, name="ubatch", default=512)
    a.add("-ctk", config.type_k, name="type_k", default="f16")
    a.add("-ctv", config.type_v, name="type_v", default="f16")
    a.add("-fa", config.flash_attn, name="flash_attn", default="auto")
    a.add("-ngl", config.n_gpu_layers, name="n_gpu_layers")
    a.add("-ncmoe", config.n_cpu_moe, name="n_cpu_moe", default=0)


def bench_args_for(config: TrialConfig, supported: frozenset[str] | None) -> list[str]:
    """bench_args against an explicit set of supported flags (None: all)."""
    a = _Args("llama-bench", supported)
    a.argv += ["-m", str(config.model), "-p", str(config.n_prompt), "-n", str(config.n_gen),
               "-r", str(config.repetitions)]
    if config.threads is not None:
        a.add("-t", config.threads, name="threads")
    _batch_cache_placement(a, config)
    if config.override_tensors:
        _check_patterns(config.override_tensors, ",;", "llama-bench")
        a.add("-ot", ";".join(config.override_tensors), name="override_tensors")
    if not a.has("-lm") and a.has("-mmp") and config.load_mode in ("mmap", "none"):  # builds before -lm
        a.add("-mmp", int(config.load_mode == "mmap"), name="load_mode")
    else:  # builds without either always mmap
        a.add("-lm", config.load_mode, name="load_mode", default="mmap")
    for name, flag in BENCH_EXTRAS.items():
        value = config.get(name)
        if value is None:
            continue
        if name == "cpu_mask" and "," in str(value):
            raise UserError(f"cpu_mask {value!r}: give one hex mask; llama-bench reads ',' as a list of masks")
        if isinstance(value, bool):
            value = int(value)
        a.add(flag, value, name=name, default=_BENCH_EXTRA_DEFAULTS[name])
    if wants_huge_pages(config):
        a.add("--no-host", 1, name="huge_pages", default=0)
    a.argv += ["-o", "json"]
    return a.argv


# llama-server's flags before --load-mode existed, for each load mode.
_LEGACY_LOAD_FLAGS = {"mmap": [], "none": ["--no-mmap"], "mlock": ["--no-mmap", "--mlock"],
                      "mmap+mlock": ["--mlock"], "dio": ["--direct-io"]}


def server_context(config: TrialConfig) -> int:
    """Context size: `ctx_size` if the campaign sets it, else room for the prompt and generation, rounded up to
    256 tokens so the BOS token and small variations never overflow it."""
    ctx = config.get("ctx_size")
    return int(ctx) if ctx is not None else 256 * math.ceil((config.n_prompt + config.n_gen + 1) / 256)


def slots(config: TrialConfig) -> int:
    """llama-server's -np: the `parallel` slots, one unless the campaign sets it (as llama-bench runs one sequence)."""
    return int(config.get("parallel", 1))


def whole_context(config: TrialConfig) -> int:
    """llama-server's -c: every slot's context."""
    return server_context(config) * slots(config)


def server_args(config: TrialConfig, tools: Any | None = None) -> list[str]:
    """llama-server flags for one configuration; --host/--port are the server engine's to add."""
    a = _Args("llama-server", tools.help_flags("llama-server") if tools is not None else None)
    config = _repack_imposed(config, tools)
    a.argv += ["-m", str(config.model)]
    if config.threads is not None:
        a.add("-t", config.threads, name="threads")
        a.add("-tb", config.get("threads_batch", config.threads), name="threads_batch")
    _batch_cache_placement(a, config)
    if config.override_tensors:
        _check_patterns(config.override_tensors, ",", "llama-server")
        a.add("-ot", ",".join(config.override_tensors), name="override_tensors")
    if a.has("-lm"):
        a.add("-lm", config.load_mode, name="load_mode")
    else:
        for flag in _LEGACY_LOAD_FLAGS[config.load_mode]:
            if not a.has(flag):
                raise UserError(f"this llama-server build has neither -lm nor {flag}, needed for "
                                f"load_mode={config.load_mode!r}; build a newer llama.cpp (`autoinfer build`)")
            a.argv.append(flag)
    for name, flag in MULTI_GPU_EXTRAS.items():  # llama-server separates the tensor split with commas
        value = config.get(name)
        if value is not None:
            a.add(flag, str(value).replace("/", ","), name=name)
    repack = config.get("repack")
    if repack is not None and not int(repack):  # llama-server spells it as a switch: --no-repack (-nr)
        flag = next((f for f in ("--no-repack", "-nr") if a.has(f)), None)
        if flag is None:
            raise UserError("this llama-server build has no --no-repack flag, needed for repack=0; build a newer "
                            "llama.cpp (`autoinfer build`) or drop repack from the campaign")
        a.argv.append(flag)
    if wants_huge_pages(config):  # llama-server spells it as a switch
        if not a.has("--no-host"):
            raise UserError("this llama-server build has no --no-host flag, needed for huge_pages=1; build a newer "
                            "llama.cpp (`autoinfer build`) or drop huge_pages from the campaign")
        a.argv.append("--no-host")
    # every slot's context, and the slots as measured: llama-server's default is 4 (-np -1, auto) where llama-bench
    # runs one sequence, and a hybrid model's recurrent state is held once per slot (63 MiB per slot on the 35B-A3B)
    a.add("-c", whole_context(config), name="ctx_size")
    a.add("-np", slots(config), name="parallel", default=1)
    return a.argv
