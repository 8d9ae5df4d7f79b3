"""`autoinfer model synth` and `autoinfer model info` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from autoinfer.cli import app
from autoinfer.errors import UserError
from autoinfer.model.gguf_info import read_info
from autoinfer.model.synth import plan

runner = CliRunner()


def test_synth_then_info(tmp_path):
    out = tmp_path / "with space" / "m.gguf"
    out.parent.mkdir()
    result = runner.invoke(app, ["model", "synth", str(out), "--preset", "tiny", "--qtype", "Q5_K", "--seed", "2"])
    assert result.exit_code == 0, result.output
    info = read_info(out)
    assert info.tensor_bytes == plan("tiny", "Q5_K").tensor_bytes
    assert info.metadata["autoinfer.synth.seed"] == 2

    table = runner.invoke(app, ["model", "info", str(out)])
    assert table.exit_code == 0, table.output
    assert "routed_experts" in table.output and f"{info.tensor_bytes:,}" in table.output

    as_json = runner.invoke(app, ["model", "info", str(out), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["tensor_bytes"] == info.tensor_bytes == sum(data["bytes_by_group"].values())
    assert data["expert_bytes_per_layer"] == list(info.expert_bytes_per_layer())
    assert len(data["tensors"]) == len(info.tensors)


def test_synth_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    result = runner.invoke(app, ["model", "synth", str(out)])
    assert isinstance(result.exception, UserError) and "--force" in str(result.exception)
    assert out.read_bytes() == b"keep me"
    assert runner.invoke(app, ["model", "synth", str(out), "--force"]).exit_code == 0
    assert read_info(out).arch == "qwen35moe"


def test_bad_input_is_one_line_and_exit_status_2(tmp_path):
    code = "import sys; sys.argv[0] = 'autoinfer'; from autoinfer.cli import main; main()"
    for args, message in (
        (["model", "info", str(tmp_path / "absent.gguf")], "no such file"),
        (["model", "synth", str(tmp_path / "m.gguf"), "--qtype", "Q9"], "unknown qtype 'Q9'"),
    ):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
