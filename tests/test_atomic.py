"""A write killed at any moment leaves the previous file or the new one, never a torn one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from autoinfer import atomic
from autoinfer.llama import quantize

WRITER = """
import sys
from autoinfer import atomic
path, fill = sys.argv[1], sys.argv[2]
for i in range(1000):
    atomic.write_text(path, fill * (8 << 20))
"""


def test_kill_during_writes_never_tears_the_file(tmp_path):
    target = tmp_path / "results.txt"
    atomic.write_text(target, "a" * (8 << 20))
    for delay in (0.05, 0.15, 0.3, 0.5):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(target), "b"])
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        text = target.read_text()
        assert len(text) == 8 << 20 and len(set(text)) == 1, "torn file"
    assert not [p for p in tmp_path.iterdir() if p.name != "results.txt" and not p.name.endswith(".tmp")]


def test_a_failure_before_the_rename_keeps_the_old_file(tmp_path):
    target = tmp_path / "trials.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic.replacing(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("killed between write and replace")
    assert target.read_text() == "old\n"
    assert list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("damage", ["", "{", '{"sha256": 5}', "\xff"])
def test_damaged_hash_memo_is_rebuilt_with_a_warning(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv("AUTOINFER_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 100)
    digest = quantize.file_sha256(model)
    (memo,) = (tmp_path / "cache" / "hashes").iterdir()
    memo.write_text(damage)
    assert quantize.file_sha256(model) == digest
    assert "damaged" in capsys.readouterr().err
    assert json.loads(memo.read_text())["sha256"] == digest
