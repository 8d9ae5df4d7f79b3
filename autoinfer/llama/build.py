"""Obtain llama.cpp and build its tools once per (commit, flags), cached outside the repository.

The default source is the llama.cpp tree vendored in the pinned llama-cpp-python sdist, so the Python bindings and
the command-line tools can share one libllama (shared libraries, LLAMA_CPP_LIB_PATH) compiled once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoinfer.errors import UserError
from autoinfer.llama import smoke
from autoinfer.llama.binaries import ENV_VAR, TOOL_NAMES, Tools, user_tools
from autoinfer.measure.gpu import list_gpus
from autoinfer.paths import cache_dir

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_BYTES = 76_589_250
SDIST_DIR = f"llama_cpp_python-{SDIST_VERSION}"
MANIFEST = "build.json"
BASE_FLAGS = (
    "CMAKE_BUILD_TYPE=Release",
    "LLAMA_CURL=OFF",
    "LLAMA_BUILD_TESTS=OFF",
    "LLAMA_BUILD_EXAMPLES=OFF",
    "LLAMA_USE_PREBUILT_UI=OFF",
    "BUILD_SHARED_LIBS=ON",
    "CMAKE_BUILD_RPATH_USE_ORIGIN=ON",  # binaries find libllama next to them after the folder is renamed
)
#: What `autoinfer build` compiles (llama-imatrix serves `model quantize --imatrix auto`). Part of the cache key, so a
#: build made before a target was added is not mistaken for one that has it.
BUILD_TARGETS = TOOL_NAMES
#: x86 ISA options of ggml (ggml/CMakeLists.txt; used by ggml/src/ggml-cpu/CMakeLists.txt when GGML_NATIVE=OFF) and
#: the /proc/cpuinfo flags each needs. A fallback build sets every one explicitly instead of -march=native.
ISA_OPTIONS = {
    "GGML_SSE42": ("sse4_2",), "GGML_F16C": ("f16c",), "GGML_FMA": ("fma",), "GGML_BMI2": ("bmi2",),
    "GGML_AVX": ("avx",), "GGML_AVX2": ("avx2",), "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",), "GGML_AVX512_VNNI": ("avx512_vnni",), "GGML_AVX512_BF16": ("avx512_bf16",),
    "GGML_AMX_TILE": ("amx_tile",), "GGML_AMX_INT8": ("amx_int8",), "GGML_AMX_BF16": ("amx_bf16",),
}
_AMX = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
#: CPU features a fallback build can leave out, with the options that carry them (AMX kernels need AVX-512 VNNI).
FEATURES = {"amx": _AMX, "avx512": ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", *_AMX)}
#: what a tree without git is named by: every input of the build (tools/ui runs scripts/ui-assets.cmake).
_SOURCE_DIRS = ("CMakeLists.txt", "cmake", "common", "ggml", "include", "src", "tools", "app", "vendor", "scripts")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_CUDA_ARCH = re.compile(r"(\d+[a-z]?(-real|-virtual)?)(;\d+[a-z]?(-real|-virtual)?)*|native|all|all-major")


@dataclass(frozen=True)
class CachedBuild:
    """One finished build in cache_dir()/llama/<key>/, as its build.json manifest describes it."""

    key: str
    path: Path
    commit: str
    flags: tuple[str, ...]
    cuda: bool
    cuda_arch: str | None
    source: str
    from_pinned_sdist: bool
    built_at: float
    build_s: float
    cpu_features_off: tuple[str, ...] = ()  # a fallback build's left-out CPU features (FEATURES)
    fallback_reason: str = ""  # the smoke failure of the build it replaces

    def tools(self) -> Tools:
        bin_dir = self.path / "bin"
        return Tools(bin_dir=bin_dir, lib_dir=bin_dir, commit=self.commit, flags=self.flags, cuda=self.cuda)


def builds_dir() -> Path:
    path = cache_dir() / "llama"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_builds() -> list[CachedBuild]:
    """Every finished build; a folder without a manifest is not one (builds are renamed into place when done)."""
    found = []
    for manifest in sorted(builds_dir().glob(f"[!.]*/{MANIFEST}")):  # .tmp-* folders are builds in progress
        data = json.loads(manifest.read_text())
        found.append(CachedBuild(
            key=data["key"], path=manifest.parent, commit=data["commit"], flags=tuple(data["flags"]),
            cuda=data["cuda"], cuda_arch=data["cuda_arch"], source=data["source"],
            from_pinned_sdist=data["from_pinned_sdist"], built_at=data["built_at"], build_s=data["build_s"],
            cpu_features_off=tuple(data.get("cpu_features_off", ())), fallback_reason=data.get("fallback_reason", ""),
        ))
    return found


def find_tools(llama_bin: Path | None = None, *, cuda: bool | None = None, build_if_missing: bool = False) -> Tools:
    """The llama.cpp build to use. cuda=None prefers a CUDA build when an NVIDIA GPU is visible, else CPU."""
    if llama_bin is not None:
        return user_tools(llama_bin)
    if os.environ.get(ENV_VAR):
        return user_tools(Path(os.environ[ENV_VAR]))
    want_cuda = bool(list_gpus()) if cuda is None else cuda
    cached = [b for b in cached_builds() if b.cuda == want_cuda or (cuda is None and not b.cuda)]
    if cached:
        cached.sort(key=lambda b: (b.cuda == want_cuda, b.from_pinned_sdist, b.built_at), reverse=True)
        return cached[0].tools()
    on_path = shutil.which("llama-bench")
    if on_path:
        tools = user_tools(Path(on_path).parent)
        if cuda is None or tools.cuda == cuda:
            return tools
    if build_if_missing:
        return build(cuda=want_cuda)
    kind = "CUDA" if want_cuda else "CPU"
    raise UserError(
        f"no {kind} llama.cpp build found; run `autoinfer build{' --cuda' if want_cuda else ''}`, "
        f"or pass --llama-bin DIR / set {ENV_VAR}"
    )


def build_lock(path: Path) -> FileLock:
    """An exclusive file lock: two processes (pytest-xdist workers, two terminals) never build the same thing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def pinned_source() -> Path:
    """vendor/llama.cpp of the pinned llama-cpp-python sdist, fetched with pip (sha256 checked) on first use."""
    src_root = cache_dir() / "src"
    tree = src_root / SDIST_DIR / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    with build_lock(src_root / ".fetch.lock"):
        if (tree / "CMakeLists.txt").is_file():
            return tree
        archive = _download_sdist(src_root)
        staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=src_root))
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(staging, filter="data")
            os.replace(staging / SDIST_DIR, src_root / SDIST_DIR)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def _download_sdist(src_root: Path) -> Path:
    archive = src_root / f"{SDIST_DIR}.tar.gz"
    if not archive.is_file() or _sha256(archive) != SDIST_SHA256:
        with tempfile.TemporaryDirectory(dir=src_root) as tmp:
            argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"{SDIST_NAME}=={SDIST_VERSION}", "-d", tmp]
            returncode, stderr = watched_download(argv, Path(tmp), archive.name, SDIST_BYTES,
                                                  f"the llama.cpp source ({SDIST_NAME} {SDIST_VERSION})")
            fetched = Path(tmp) / archive.name
            if returncode != 0 or not fetched.is_file():
                last = (stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"pip could not download {SDIST_NAME}=={SDIST_VERSION} ({last}); "
                                f"check the network or pass --source with a llama.cpp checkout")
            os.replace(fetched, archive)
    digest = _sha256(archive)
    if digest != SDIST_SHA256:
        archive.unlink()
        raise UserError(f"{archive.name} has sha256 {digest}, expected {SDIST_SHA256}; the download was altered, "
                        f"retry or pass --source with a llama.cpp checkout")
    return archive


def watched_download(argv: list[str], folder: Path, name: str, total: int, what: str,
                     every_s: float = 3.0) -> tuple[int, str]:
    """Run a download command whose temporary files go under `folder` (TMPDIR), printing on stderr every `every_s`
    seconds how much of the files called `name` has arrived: pip shows nothing when its output is captured.
    Returns (exit status, stderr)."""
    work = folder / ".download"
    work.mkdir()
    with open(folder / ".stderr", "w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "TMPDIR": str(work)})
        started = time.monotonic()
        while proc.poll() is None:
            try:
                proc.wait(timeout=every_s)
            except subprocess.TimeoutExpired:
                try:
                    got = sum(f.stat().st_size for f in work.rglob(name))
                except FileNotFoundError:  # the downloader moved a file or folder while it was counted
                    continue
                print(f"downloading {what}: {got / 1e6:.1f} of {total / 1e6:.1f} MB, "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        err.seek(0)
        return proc.returncode, err.read()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_source(source: Path) -> Path:
    """A llama.cpp source tree has a top-level CMakeLists.txt and tools/llama-bench."""
    source = Path(source).expanduser().resolve()
    if not source.is_dir():
        raise UserError(f"--source {source} does not exist; pass a llama.cpp checkout")
    if not (source / "CMakeLists.txt").is_file() or not (source / "tools" / "llama-bench").is_dir():
        raise UserError(f"--source {source} is not a llama.cpp source tree (needs CMakeLists.txt and "
                        f"tools/llama-bench); pass the root of a llama.cpp checkout")
    return source


def source_identity(source: Path) -> tuple[str, str]:
    """(commit, content digest). Git trees give `rev-parse --short HEAD` (+"-dirty" with the diff in the digest);
    trees without git are named by a hash of their sources, since nothing else identifies them honestly."""
    git = shutil.which("git")
    if git and _git(git, source, "rev-parse", "--show-toplevel") == str(source):
        commit = _git(git, source, "rev-parse", "--short", "HEAD")
        if _git(git, source, "status", "--porcelain", "--untracked-files=no"):
            diff = subprocess.run([git, "diff", "HEAD"], check=False, cwd=source, capture_output=True).stdout
            return f"{commit}-dirty", hashlib.sha256(diff).hexdigest()
        return commit, ""
    digest = hashlib.sha256()
    for top in _SOURCE_DIRS:
        paths = [source / top] if (source / top).is_file() else sorted((source / top).rglob("*"))
        for path in paths:
            if path.is_file() and not path.is_symlink():
                digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    content = digest.hexdigest()
    return f"src-{content[:12]}", content


def _git(git: str, cwd: Path, *args: str) -> str:
    done = subprocess.run([git, *args], check=False, cwd=cwd, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _cuda_compiler() -> Path:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (shutil.which("nvcc"), os.path.join(cuda_home, "bin", "nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise UserError("--cuda needs the CUDA toolkit (nvcc not on PATH nor in $CUDA_HOME/bin); install it or drop --cuda")


def _default_cuda_arch() -> str:
    """The compute capability of GPU 0 (e.g. "90" on an H100): building for one architecture is several times faster."""
    import pynvml

    try:
        pynvml.nvmlInit()
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise UserError(f"no NVIDIA GPU visible to choose the CUDA architecture ({exc}); pass --cuda-arch "
                        f"(e.g. 90 for H100, 89 for RTX 40xx)") from exc
    return f"{major}{minor}"


def _build_tools() -> tuple[Path, Path]:
    """cmake and ninja: cmake from the system, ninja from PATH or the `ninja` Python package."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise UserError("cmake is not installed; install it (apt install cmake, or pip install cmake) and retry")
    ninja = shutil.which("ninja")
    if ninja is None:
        try:
            import ninja as ninja_pkg
        except ImportError as exc:
            raise UserError("ninja is not installed; pip install ninja (or apt install ninja-build) and retry") from exc
        ninja = os.path.join(ninja_pkg.BIN_DIR, "ninja")
    return Path(cmake), Path(ninja)


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (/proc/cpuinfo), empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def variant_flags(flags: frozenset[str], off: tuple[str, ...]) -> list[str]:
    """CMake definitions of a fallback CPU build: no -march=native, every ISA option this CPU has on, except the
    options of the features in `off`; every other option off (ggml turns some on by default without native)."""
    unknown = [f for f in off if f not in FEATURES]
    if unknown:
        raise UserError(f"unknown CPU feature {unknown[0]!r} to leave out; use one of {', '.join(FEATURES)}")
    if not flags & {"avx", "sse4_2"}:
        raise UserError("a build without a CPU feature needs x86 CPU flags in /proc/cpuinfo, and none were found; "
                        "build llama.cpp yourself and pass --llama-bin")
    dropped = {opt for feature in off for opt in FEATURES[feature]}
    return ["GGML_NATIVE=OFF"] + [f"{opt}={'ON' if all(f in flags for f in need) and opt not in dropped else 'OFF'}"
                                  for opt, need in ISA_OPTIONS.items()]


def build_key(commit: str, content: str, flags: list[str], variant: str) -> str:
    """The cache folder name: commit, variant and a digest of everything that changes the binaries."""
    digest = hashlib.sha256(json.dumps([commit, content, flags, BUILD_TARGETS]).encode()).hexdigest()[:10]
    return f"{commit}-{variant}-{digest}"


def build(source: Path | None = None, *, cuda: bool = False, cuda_arch: str | None = None,
          console: Console | None = None, cpu_features_off: tuple[str, ...] = (), fallback_reason: str = "",
          smoke_again: bool = False) -> Tools:
    """Build the llama.cpp tools and shared libraries, or return the cached build of the same (commit, flags); then
    make sure it runs (checked: smoke run, repack off or a build without the failing CPU feature).

    `cpu_features_off` makes a fallback build (GGML_NATIVE=OFF, explicit ISA options) with its own cache key."""
    if cuda_arch and not cuda:
        raise UserError("--cuda-arch only applies to CUDA builds; add --cuda or drop --cuda-arch")
    if cuda_arch and not _CUDA_ARCH.fullmatch(cuda_arch):
        raise UserError(f"--cuda-arch {cuda_arch!r} is not a CUDA architecture list; use e.g. 90, 89 or 86;90")
    pinned = source is None
    source = pinned_source() if pinned else check_source(source)
    commit, content = source_identity(source)
    flags = list(BASE_FLAGS)
    if cuda:
        cuda_arch = cuda_arch or _default_cuda_arch()
        flags += ["GGML_CUDA=ON", f"CMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    variant = f"cuda{cuda_arch.replace(';', '_')}" if cuda else "cpu"
    if cpu_features_off:
        flags += variant_flags(cpu_flags(), cpu_features_off)
        variant += "-no" + "-no".join(cpu_features_off)
    key = build_key(commit, content, flags, variant)
    final = builds_dir() / key
    console = console or Console(stderr=True)
    with build_lock(builds_dir() / f".{key}.lock"):
        if not (final / MANIFEST).is_file():
            _build_into(final, source, commit, tuple(flags), cuda, cuda_arch, pinned, console,
                        {"cpu_features_off": list(cpu_features_off), "fallback_reason": fallback_reason})
    return checked(next(b for b in cached_builds() if b.key == key).tools(), console, smoke_again=smoke_again)


def working_tools(llama_bin: Path | None = None, *, cuda: bool | None = None,
                  console: Console | None = None) -> Tools:
    """The llama.cpp build to use (binaries.find_tools, built on first use), smoke-run and made to work."""
    return checked(find_tools(llama_bin, cuda=cuda, build_if_missing=True), console or Console(stderr=True))


def checked(tools: Tools, console: Console, *, smoke_again: bool = False) -> Tools:
    """A build that ran its smoke run: as it is, with repack off, or replaced by a build without the CPU feature
    that crashes. Every decision is printed here and recorded (smoke.json, the fallback build's manifest)."""
    record = None if smoke_again else smoke.load(tools)
    if record is None:
        console.print(f"smoke run of llama.cpp {tools.commit} ({tools.bin_dir}): llama-bench on the tiny model, "
                      f"weight types {', '.join(smoke.SMOKE_TYPES)}", soft_wrap=True)
        record = smoke.run(tools)
        console.print(f"smoke run: {record.summary()}", soft_wrap=True, markup=False)
        if record.verdict != "ok":
            console.print(f"decision: {record.decision} (recorded in {smoke.record_path(tools)})", soft_wrap=True,
                          markup=False)
    if record.verdict in ("ok", "unverified"):
        return tools
    if record.repack_off:
        return replace(tools, repack_off=True, decision=record.decision)
    return _fallback(tools, record, console)


def features_to_leave_out(record: smoke.SmokeRecord) -> list[tuple[str, ...]]:
    """Fallback builds to try, in order: the feature the crash names (AMX or AVX-512), else AMX first (what VMs
    most often refuse), then AMX and AVX-512 together."""
    text = " ".join(f"{r.component or ''} {r.reason}" for r in record.failures).lower()
    first = ("avx512",) if "avx512" in text and "amx" not in text else ("amx",)
    return [first] if first == ("avx512",) else [first, ("amx", "avx512")]


def _fallback(tools: Tools, record: smoke.SmokeRecord, console: Console) -> Tools:
    failure = next(r for r in record.failures if r.signal)
    made = next((b for b in cached_builds() if b.path == tools.bin_dir.parent), None)
    also = " even with --repack 0" if any(r.repack == 0 for r in record.failures) else ""
    if made is None:
        host = cpu_flags()
        flags = " ".join(f"-D{f}" for f in variant_flags(host, ("amx",))) if host & {"avx"} else "-DGGML_NATIVE=OFF"
        raise UserError(f"llama-bench in {tools.bin_dir} crashes on {failure.qtype} weights{also} ({failure.reason}); "
                        f"rebuild it with {flags}, or drop --llama-bin/{ENV_VAR} so `autoinfer build` makes one")
    for off in features_to_leave_out(record):
        if set(off) <= set(made.cpu_features_off):
            continue
        console.print(f"decision: rebuilding llama.cpp {made.commit} without {' and '.join(o.upper() for o in off)} "
                      f"(GGML_NATIVE=OFF, explicit ISA options) because {failure.qtype} crashes{also}: "
                      f"{failure.reason}", soft_wrap=True, markup=False)
        return build(None if made.from_pinned_sdist else Path(made.source), cuda=made.cuda, cuda_arch=made.cuda_arch,
                     console=console, cpu_features_off=tuple(sorted({*made.cpu_features_off, *off})),
                     fallback_reason=f"{made.key}: {failure.reason}")
    raise UserError(f"llama.cpp {made.commit} crashes on {failure.qtype} weights{also} even built without "
                    f"{' and '.join(made.cpu_features_off).upper() or 'the features it could leave out'} "
                    f"({failure.reason}); build llama.cpp for this CPU yourself and pass --llama-bin")


def _build_into(final: Path, source: Path, commit: str, flags: tuple[str, ...], cuda: bool, cuda_arch: str | None,
                pinned: bool, console: Console, extra: dict[str, object]) -> None:
    """Configure and build in a temporary folder, keep bin/ and the log, then rename it into place atomically."""
    cmake, ninja = _build_tools()
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    tree, log_path = work / "cmake", work / "build.log"
    defines = [f"-D{flag}" for flag in flags]
    defines += [f"-DLLAMA_BUILD_COMMIT={commit}", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    env = dict(os.environ)
    if shutil.which("ccache"):
        launchers = ["C", "CXX"] + (["CUDA"] if cuda else [])
        defines += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in launchers]
        env.update(CCACHE_BASEDIR=str(source.parent), CCACHE_NOHASHDIR="1")
    if cuda:
        defines.append(f"-DCMAKE_CUDA_COMPILER={_cuda_compiler()}")
    started = time.time()
    variant = f"CUDA {cuda_arch}" if cuda else "CPU"
    with log_path.open("w") as log:
        _run_logged([str(cmake), "-S", str(source), "-B", str(tree), "-G", "Ninja", *defines], env, log, log_path,
                    "configure", console, None)
        _run_logged([str(cmake), "--build", str(tree), "--target", *BUILD_TARGETS, "-j", str(os.cpu_count() or 1)],
                    env, log, log_path, "build", console, f"llama.cpp {commit} ({variant})")
    missing = [name for name in BUILD_TARGETS if not (tree / "bin" / name).is_file()]
    if missing:
        raise UserError(f"the build finished without {', '.join(missing)}; see the log {log_path}")
    os.replace(tree / "bin", work / "bin")
    shutil.rmtree(tree)
    manifest = {
        "key": final.name, "commit": commit, "flags": list(flags), "cuda": cuda, "cuda_arch": cuda_arch,
        "source": str(source), "from_pinned_sdist": pinned,
        "sdist": {"name": SDIST_NAME, "version": SDIST_VERSION, "sha256": SDIST_SHA256} if pinned else None,
        "tools": list(BUILD_TARGETS), "built_at": time.time(), "build_s": round(time.time() - started, 1), **extra,
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)  # a folder left without its manifest is not a build
    os.replace(work, final)


def _run_logged(argv: list[str], env: dict[str, str], log, log_path: Path, step: str, console: Console,
                title: str | None) -> None:
    """Run one step with its output in the log; ninja's "[n/N]" lines drive a progress bar when a title is given."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    try:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise UserError(f"cannot start {argv[0]} ({exc}); see the log {log_path}") from exc
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=title is None) as progress:
        task = progress.add_task(title or step, total=None)
        for line in child.stdout:
            log.write(line)
            if match := _NINJA_STEP.match(line):
                log.flush()  # someone tailing the log sees each finished step
                progress.update(task, completed=int(match.group(1)), total=int(match.group(2)))
        returncode = child.wait()
    log.flush()
    if returncode != 0:
        raise UserError(f"llama.cpp {step} failed (exit {returncode}); see the log {log_path}")
