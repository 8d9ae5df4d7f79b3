"""`autoinfer build` / `doctor` end to end, source identity, and build failures reported as one line plus a log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoinfer.errors import UserError
from autoinfer.llama.build import build, cached_builds, find_tools, source_identity
from autoinfer.measure.gpu import list_gpus
from autoinfer.measure.host import huge_pages_refusal

ENTRY = "import sys; from autoinfer.cli import main; sys.argv[0] = 'autoinfer'; main()"


def autoinfer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "250", **(env or {})}
    return subprocess.run([sys.executable, "-c", ENTRY, *args], check=False, capture_output=True, text=True,
                          env=full_env, timeout=300)


def test_build_command_on_cached_build_prints_the_folder(llama_tools):
    done = autoinfer("build")
    assert done.returncode == 0, done.stderr
    assert str(llama_tools.bin_dir) in done.stdout.replace("\n", "")
    assert llama_tools.commit in done.stdout


def test_doctor_lists_the_build_and_the_host(llama_tools):
    done = autoinfer("doctor", env={"AUTOINFER_LLAMA_BIN": ""})
    assert done.returncode == 0, done.stderr
    key = llama_tools.bin_dir.parent.name
    assert key in done.stdout and f"selected build: {llama_tools.bin_dir}" in done.stdout.replace("\n", "")
    assert f"{os.cpu_count()} logical" in done.stdout and "GiB total" in done.stdout
    assert "extra: torch" in done.stdout and "GPUs (NVML)" in done.stdout
    refusal = huge_pages_refusal()
    said = " ".join(done.stdout.replace("│", " ").split())
    assert (f"not searched: {' '.join(refusal.split())}" if refusal else "huge_pages: 1 can run here") in said


def test_source_that_is_not_llama_cpp_exits_2(tmp_path):
    done = autoinfer("build", "--source", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error:") and "not a llama.cpp source tree" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_cuda_arch_exits_2():
    done = autoinfer("build", "--cuda-arch", "90")
    assert done.returncode == 2 and "--cuda-arch only applies to CUDA builds" in done.stderr
    done = autoinfer("build", "--cuda", "--cuda-arch", "9x0")
    assert done.returncode == 2 and "not a CUDA architecture list" in done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not list_gpus(), reason="needs an NVIDIA GPU and the CUDA toolkit")
def test_cuda_build_sees_the_gpu():
    tools = find_tools(cuda=True, build_if_missing=True)
    assert tools.cuda and (tools.lib_dir / "libggml-cuda.so").exists()
    done = subprocess.run([str(tools.tool("llama-bench")), "--list-devices"], check=False, capture_output=True,
                          text=True)
    assert "CUDA0" in done.stdout + done.stderr


def test_failing_configure_exits_2_and_keeps_the_log(tmp_path):
    source = tmp_path / "broken llama"
    (source / "tools" / "llama-bench").mkdir(parents=True)
    (source / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\nproject(x C)\n'
                                           'message(FATAL_ERROR "broken on purpose")\n')
    cache = tmp_path / "cache"
    done = autoinfer("build", "--source", str(source), env={"AUTOINFER_CACHE": str(cache)})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "configure failed" in done.stderr
    log = Path(done.stderr.strip().rsplit("see the log ", 1)[1])
    assert log.is_file() and log.is_relative_to(cache) and "broken on purpose" in log.read_text()
    assert not list((cache / "llama").glob("*/build.json"))  # nothing half-built is offered as a build


def test_source_identity_of_git_trees(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    (tmp_path / "f.c").write_text("int x;\n")
    for args in (["init", "-q"], ["add", "f.c"], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=tmp_path, capture_output=True,
                          text=True)
    assert source_identity(tmp_path) == (head.stdout.strip(), "")
    (tmp_path / "f.c").write_text("int y;\n")
    commit, digest = source_identity(tmp_path)
    (tmp_path / "f.c").write_text("int z;\n")
    assert commit == head.stdout.strip() + "-dirty" and digest and source_identity(tmp_path)[1] != digest


def test_source_identity_without_git_hashes_the_sources(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.cpp").write_text("int a;\n")
    first = source_identity(tmp_path)
    (tmp_path / "src" / "a.cpp").write_text("int b;\n")
    second = source_identity(tmp_path)
    assert first[0].startswith("src-") and second[0].startswith("src-") and first != second
    (tmp_path / "scripts").mkdir()  # the build runs scripts/ui-assets.cmake
    (tmp_path / "scripts" / "ui-assets.cmake").write_text("message(a)\n")
    assert source_identity(tmp_path) != second


def test_build_of_the_same_source_is_not_repeated(llama_tools):
    cached = next(b for b in cached_builds() if b.tools() == llama_tools)
    log = cached.path / "build.log"
    before = log.stat().st_mtime_ns
    source = None if cached.from_pinned_sdist else Path(cached.source)
    assert build(source) == llama_tools and log.stat().st_mtime_ns == before


def test_empty_source_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a llama.cpp source tree"):
        build(tmp_path)
