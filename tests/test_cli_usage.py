"""Every command's usage errors end as one line on stderr with exit status 2, through the real `autoinfer` script.

The table is built from the Typer app itself, so a command or option added later is covered without editing this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer

from autoinfer.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("autoinfer")


def _leaves(command, path=()):
    """(path, command) of every runnable command; groups recurse."""
    subs = getattr(command, "commands", None)
    if subs is None:
        yield path, command
        return
    for name, sub in subs.items():
        yield from _leaves(sub, (*path, name))


def _groups(command, path=()):
    subs = getattr(command, "commands", None)
    if subs is not None:
        yield path
        for name, sub in subs.items():
            yield from _groups(sub, (*path, name))


ROOT_COMMAND = typer.main.get_command(app)
LEAVES = list(_leaves(ROOT_COMMAND))
GROUPS = list(_groups(ROOT_COMMAND))


def _numeric_options(command):
    return [p for p in command.params if p.param_type_name == "option" and p.bare_type() in ("int", "float")]


def _cases():
    cases = []
    for path, command in LEAVES:
        name = " ".join(path)
        cases.append((f"{name}: unknown option", [*path, "--no-such-option"]))
        required = [p for p in command.params if p.required]
        if required:
            cases.append((f"{name}: missing {required[0].name}", list(path)))
        for option in _numeric_options(command):
            flag = option.opts[0]
            cases.append((f"{name} {flag}: not a number", [*path, flag, "abc"]))
            cases.append((f"{name} {flag}: below its minimum", [*path, flag, str(option.min - 1)]))
    for path in GROUPS:
        cases.append((f"{' '.join(path) or 'autoinfer'}: unknown command", [*path, "no-such-command"]))
        cases.append((f"{' '.join(path) or 'autoinfer'}: no command", list(path)))
    return cases


CASES = _cases()


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def results():
    """All cases at once, a few processes in parallel: each is a fresh interpreter importing the whole CLI."""
    assert SCRIPT.exists(), f"the autoinfer console script is not installed next to {sys.executable}"
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((case for case, _ in CASES), pool.map(_run, (args for _, args in CASES))))


def test_every_numeric_option_declares_a_minimum():
    missing = [f"{' '.join(path)} {p.opts[0]}" for path, cmd in LEAVES for p in _numeric_options(cmd) if p.min is None]
    assert not missing, f"numeric options without a minimum: {missing}"


def test_the_table_covers_every_command():
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"sweep", "status", "export", "analyze", "model synth", "engine bench"} <= names
    assert sum(case.endswith("below its minimum") for case, _ in CASES) >= 10


@pytest.mark.parametrize("case", [case for case, _ in CASES])
def test_usage_error_is_one_line_with_exit_2(results, case):
    done = results[case]
    lines = done.stderr.splitlines()
    assert done.returncode == 2, (case, done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, (case, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), (case, done.stderr)
    if case.endswith("below its minimum"):
        assert "greater than or equal" in lines[0] and "--" in lines[0], lines[0]
