"""Locating llama.cpp: the cached build works, is reused, and explicit folders / the env var / PATH take their turn."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autoinfer.errors import UserError
from autoinfer.llama.binaries import ENV_VAR, TOOL_NAMES, parse_help_flags, user_tools
from autoinfer.llama.build import MANIFEST, cached_builds, find_tools

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def cached_build(llama_tools):
    """The session's build, for the tests about the cache: skipped when ENV_VAR points the session at another."""
    if os.environ.get(ENV_VAR):
        pytest.skip(f"{ENV_VAR} is set: the session runs on that build, not on the cached one these tests check")
    return llama_tools


def linked_bin(folder: Path, tools, names=TOOL_NAMES) -> Path:
    """A user's binary folder: links to the cached build's binaries (they find libllama through $ORIGIN)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(tools.tool(name))
    return folder


def test_cached_build_runs_and_manifest_records_commit_and_flags(cached_build):
    for name in TOOL_NAMES:
        done = subprocess.run([str(cached_build.tool(name)), "--help"], check=False, capture_output=True, text=True,
                              timeout=60)
        assert "usage" in (done.stdout + done.stderr).lower(), name
    manifest = json.loads((cached_build.bin_dir.parent / MANIFEST).read_text())
    assert manifest["commit"] == cached_build.commit and manifest["flags"] == list(cached_build.flags)
    assert "BUILD_SHARED_LIBS=ON" in cached_build.flags and not cached_build.cuda
    assert (cached_build.lib_dir / "libllama.so").exists()
    assert cached_build.env() == {"LLAMA_CPP_LIB_PATH": str(cached_build.lib_dir)}
    version = subprocess.run([str(cached_build.tool("llama-bench")), "--version"], check=False, capture_output=True,
                             text=True)
    assert f"commit {cached_build.commit})" in version.stdout + version.stderr  # LLAMA_BUILD_COMMIT reached the binary


def test_llama_bench_json_reports_the_recorded_commit(llama_tools, tiny_model):
    argv = [str(llama_tools.tool("llama-bench")), "-m", str(tiny_model), "-p", "8", "-n", "2", "-r", "1",
            "-t", "1", "-o", "json"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert rows and {row["build_commit"] for row in rows} == {llama_tools.commit}


def test_pinned_sdist_build_reports_the_vendored_commit(cached_build):
    build = next(b for b in cached_builds() if b.tools() == cached_build)
    if not build.from_pinned_sdist:
        pytest.skip("the session build came from a user checkout")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=build.source, capture_output=True,
                          text=True)
    assert cached_build.commit.startswith(head.stdout.strip()) and head.stdout.strip()


def test_second_call_reuses_the_build(cached_build, no_env):
    manifest = cached_build.bin_dir.parent / MANIFEST
    before = manifest.stat().st_mtime_ns
    again = find_tools(build_if_missing=True, cuda=False)
    assert again == cached_build and manifest.stat().st_mtime_ns == before


def test_help_flags_of_real_binaries(llama_tools):
    bench = llama_tools.help_flags("llama-bench")
    assert {"-ngl", "--n-gpu-layers", "-ncmoe", "--n-cpu-moe", "-ub", "--ubatch-size", "-o", "-fa"} <= bench
    assert "--threads-batch" not in bench and "-tb" not in bench  # llama-bench has one -t for both
    server = llama_tools.help_flags("llama-server")
    assert {"-tb", "--threads-batch", "-h", "--help", "--usage", "--metrics"} <= server


def test_parse_help_flags_edge_cases():
    flags = parse_help_flags((FIXTURES / "help_mixed.txt").read_text())
    assert flags == {"-h", "--help", "--usage", "-m", "--model", "-hf", "-hfr", "--hf-repo", "-ot",
                     "--override-tensor", "--allow-requantize", "--pure", "--version"}


def test_explicit_folder_beats_env_var_which_beats_cache(cached_build, tmp_path, monkeypatch):
    mine = linked_bin(tmp_path / "my bin", cached_build)  # a space in the path must survive
    theirs = linked_bin(tmp_path / "env bin", cached_build, ("llama-bench",))
    monkeypatch.setenv(ENV_VAR, str(theirs))
    assert find_tools().bin_dir == theirs.resolve()
    chosen = find_tools(mine)
    assert chosen.bin_dir == mine.resolve() and chosen.commit == cached_build.commit and not chosen.cuda
    assert chosen.lib_dir is None and chosen.flags == ()
    done = subprocess.run([str(chosen.tool("llama-bench")), "--help"], check=False, capture_output=True, timeout=60)
    assert done.returncode == 0


def test_cache_beats_path_and_path_is_used_without_cache(cached_build, tmp_path, monkeypatch, no_env):
    on_path = linked_bin(tmp_path / "path bin", cached_build, ("llama-bench",))
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    assert find_tools(cuda=False) == cached_build
    monkeypatch.setenv("AUTOINFER_CACHE", str(tmp_path / "empty cache"))
    assert find_tools(cuda=False).bin_dir == on_path.resolve()


def test_missing_tool_is_a_user_error_naming_it(llama_tools, tmp_path):
    only_bench = user_tools(linked_bin(tmp_path / "b", llama_tools, ("llama-bench",)))
    with pytest.raises(UserError, match="llama-server"):
        only_bench.tool("llama-server")


def test_folder_without_llama_binaries_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="none of llama-bench"):
        user_tools(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        user_tools(tmp_path / "nope")


def test_no_cuda_build_and_no_building_is_a_user_error(tmp_path, monkeypatch, no_env):
    monkeypatch.setenv("AUTOINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="autoinfer build --cuda"):
        find_tools(cuda=True)
