"""`autoinfer build` (llama.cpp tools, cached per commit and flags) and `autoinfer doctor` (what this machine has)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil
from pathlib import Path
from typing import Optional

import psutil
import typer
from rich.console import Console
from rich.table import Table

from autoinfer.errors import UserError
from autoinfer.paths import cache_dir, results_dir

PACKAGES = ("autoinfer", "optuna", "gguf", "numpy", "scipy", "pandas", "matplotlib", "nvidia-ml-py", "psutil",
            "typer", "rich", "pydantic", "sqlalchemy")
EXTRAS = {"torch": "torch", "llama_cpp": "llama-cpp-python", "psycopg2": "psycopg2-binary"}
PROGRAMS = ("cmake", "ninja", "ccache", "git", "nvcc")


def register(app: typer.Typer) -> None:
    app.command("build")(build_command)
    app.command()(doctor)


def build_command(
    cuda: bool = typer.Option(False, "--cuda", help="Build the CUDA backend (needs nvcc)."),
    cuda_arch: Optional[str] = typer.Option(None, "--cuda-arch", help="CUDA architecture, e.g. 90 (default: GPU 0's)."),
    source: Optional[Path] = typer.Option(None, "--source", help="llama.cpp checkout (default: the pinned sdist's)."),
) -> None:
    """Build llama-bench, llama-server, llama-cli, llama-perplexity, llama-quantize, llama-fit-params and libllama,
    then smoke-run llama-bench on the tiny model for every weight type (again, if the build was cached)."""
    from autoinfer.llama.build import build

    console = Console()
    tools = build(source, cuda=cuda, cuda_arch=cuda_arch, console=Console(stderr=True), smoke_again=True)
    console.print(f"llama.cpp {tools.commit} ({'CUDA' if tools.cuda else 'CPU'}) in")
    console.print(str(tools.bin_dir), soft_wrap=True)
    if tools.repack_off:
        console.print(f"runs with repack off: {tools.decision}", soft_wrap=True, markup=False)


def doctor(
    llama_bin: Optional[Path] = typer.Option(None, "--llama-bin", help="Folder with your own llama.cpp binaries."),
) -> None:
    """List cached llama.cpp builds, the build chosen by default, GPUs, CPU, memory, disk and package versions."""
    console = Console()
    console.print(_builds_table())
    console.print(f"selected build: {_selected(llama_bin)}", soft_wrap=True)
    for line in _smoke_lines(llama_bin):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    console.print(_gpu_table())
    console.print(_host_table())
    console.print(_software_table())


def _builds_table() -> Table:
    from autoinfer.llama import smoke
    from autoinfer.llama.binaries import TOOL_NAMES
    from autoinfer.llama.build import BASE_FLAGS, builds_dir, cached_builds

    table = Table(title=f"llama.cpp builds in {builds_dir()}")
    for column in ("key", "commit", "flags", "tools", "size", "build time", "smoke run"):
        table.add_column(column)
    for item in cached_builds():
        record = smoke.load(item.tools())
        bin_dir = item.tools().bin_dir
        missing = [name for name in TOOL_NAMES if not (bin_dir / name).is_file()]
        size = sum(p.stat().st_size for p in item.path.rglob("*") if p.is_file() and not p.is_symlink())
        extra = [flag for flag in item.flags if flag not in BASE_FLAGS]
        if item.cpu_features_off:
            extra = [f"without {', '.join(item.cpu_features_off).upper()} (replaces {item.fallback_reason})"]
        table.add_row(item.key, item.commit, " ".join(extra) or "CPU", "missing " + ", ".join(missing) if missing
                      else f"all {len(TOOL_NAMES)}", f"{size / 2**20:.0f} MiB", f"{item.build_s:.0f} s",
                      record.verdict if record else "not run yet")
    if not table.row_count:
        table.caption = "none yet: run `autoinfer build`"
    return table


def _selected(llama_bin: Path | None) -> str:
    from autoinfer.llama.build import find_tools

    try:
        tools = find_tools(llama_bin)
    except UserError as exc:
        return f"none ({exc})"
    return f"{tools.bin_dir} (commit {tools.commit}, {'CUDA' if tools.cuda else 'CPU'})"


def _smoke_lines(llama_bin: Path | None) -> list[str]:
    """The selected build's smoke run (llama.smoke) and the decision it led to; it runs on first use or
    `autoinfer build`, never here."""
    from autoinfer.llama import smoke
    from autoinfer.llama.build import find_tools

    try:
        tools = find_tools(llama_bin)
    except UserError:
        return []
    record = smoke.load(tools)
    if record is None:
        return ["smoke run: not run yet for this binary (it runs on first use, or now with `autoinfer build`)"]
    return [f"smoke run ({smoke.record_path(tools)}): {record.verdict}: {record.summary()}",
            f"decision: {record.decision}"]


def _gpu_table() -> Table:
    from autoinfer.measure.gpu import list_gpus

    table = Table(title="GPUs (NVML)")
    for column in ("index", "name", "memory", "driver", "CUDA (driver)"):
        table.add_column(column)
    for gpu in list_gpus():
        table.add_row(str(gpu.index), gpu.name, f"{gpu.memory_total_mib:.0f} MiB", gpu.driver, gpu.cuda_version)
    if not table.row_count:
        table.caption = "no NVIDIA GPU visible"
    return table


def _host_table() -> Table:
    from autoinfer.measure.host import host_info, huge_pages_refusal, ram_limit_mib

    host = host_info()
    table = Table(title="host", show_header=False)
    table.add_row("CPU", host.cpu_model)
    table.add_row("cores", f"{host.physical_cores} physical, {host.logical_cores} logical, "
                           f"{host.usable_cores} usable")
    table.add_row("memory", f"{host.ram_total_mib / 1024:.1f} GiB total, "
                            f"{psutil.virtual_memory().available / 2**30:.1f} GiB available, "
                            f"{ram_limit_mib() / 1024:.1f} GiB limit")
    table.add_row("OS", host.os)
    refusal = huge_pages_refusal()
    table.add_row("huge pages", f"not searched: {refusal}" if refusal else "huge_pages: 1 can run here (transparent "
                  "huge pages for malloc's blocks, glibc.malloc.hugetlb)")
    for label, folder in (("cache", cache_dir()), ("results", results_dir())):
        probe = next(p for p in (folder, *folder.parents) if p.exists())
        table.add_row(f"free disk ({label})", f"{shutil.disk_usage(probe).free / 2**30:.1f} GiB at {folder}")
    return table


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _software_table() -> Table:
    table = Table(title="software", show_header=False)
    table.add_row("python", f"{platform.python_version()} ({platform.python_implementation()})")
    for distribution in PACKAGES:
        table.add_row(distribution, _version(distribution))
    for module, distribution in EXTRAS.items():
        found = importlib.util.find_spec(module) is not None
        table.add_row(f"extra: {module}", _version(distribution) if found else "not importable")
    for program in PROGRAMS:
        table.add_row(f"program: {program}", shutil.which(program) or "not found")
    return table
