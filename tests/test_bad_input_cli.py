"""Bad file contents and values at every command: exit 2, one line on stderr naming the problem, no traceback,
and the user's files left as they were."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-c", "from autoinfer.cli import main; main()"]
CAMPAIGN = "name: bad\nengine: replay\nengine_options: {table: t.csv}\nmodel: m\nspace: {threads: [1, 2]}\n"
TABLE = "threads,tg,pp,rss_mib\n1,10,100,500\n2,12,110,600\n"

# (name, files to write, argv, text the error must contain)
CASES = [
    ("sweep non-UTF-8", {"c.yaml": b"name: a\xff\n"}, ["sweep", "c.yaml"], "is not UTF-8"),
    ("sweep duplicate key", {"c.yaml": CAMPAIGN + "model: n\n"}, ["sweep", "c.yaml"], "appears twice"),
    ("sweep infinite timeout", {"c.yaml": CAMPAIGN + "measure: {timeout_s: .inf}\n"}, ["sweep", "c.yaml"],
     "not a finite number"),
    ("sweep huge int", {"c.yaml": CAMPAIGN + "budget: {trials: " + "9" * 5000 + "}\n"}, ["sweep", "c.yaml"],
     "below 2^63"),
    ("sweep deep nesting", {"c.yaml": CAMPAIGN.replace("{table: t.csv}", "{table: t.csv, x: " + "[" * 900
                                                       + "]" * 900 + "}")}, ["sweep", "c.yaml"], "nested more"),
    ("sweep alias bomb", {"c.yaml": CAMPAIGN + "".join(
        f"x{i}: &x{i} [{', '.join([f'*x{i - 1}' if i else '1'] * 9)}]\n" for i in range(7))},
     ["sweep", "c.yaml"], "expand to more than"),
    ("sweep step 0", {"c.yaml": CAMPAIGN.replace("[1, 2]", "{low: 1, high: 8, step: 0}"), "t.csv": TABLE},
     ["sweep", "c.yaml"], "step"),
    ("sweep unknown engine option", {"c.yaml": CAMPAIGN.replace("engine: replay\n", "").replace(
        "{table: t.csv}", "{foo: 1}")}, ["sweep", "c.yaml"], "engine_options.foo"),
    ("sweep not a mapping", {"c.yaml": "- 1\n- 2\n"}, ["sweep", "c.yaml"], "must be a YAML mapping"),
    ("status bad storage", {}, ["status", "--storage", "mysql://u:pw@h/db"], "cannot open storage"),
    ("export bad storage", {}, ["export", "--storage", "sqlite:////nonexistent/dir/x.db"], "cannot open storage"),
    ("import NaN samples", {"b.jsonl": '{"model_filename": "m", "n_prompt": 0, "n_gen": 8, "samples_ts": [NaN]}\n'},
     ["import", "b.jsonl", "--study", "s", "--storage", "sqlite:///s.db"], ""),
    ("import deep JSON", {"b.json": "[" * 100000 + "]" * 100000}, ["import", "b.json", "--study", "s",
                                                                    "--storage", "sqlite:///s.db"], "nested too deep"),
    ("import binary CSV", {"b.csv": b"tg,pp\n\x00\x00\"\n"}, ["import", "b.csv", "--study", "s",
                                                           "--storage", "sqlite:///s.db"], ""),
    ("replay text in tg", {"t.csv": "threads,tg\n1,abc\n2,3\n"}, ["replay", "t.csv"], "not a number"),
    ("replay pp-only table", {"t.csv": "threads,pp\n1,3\n2,4\n"}, ["replay", "t.csv"], "--objective pp"),
    ("replay empty column", {"t.csv": "threads,e,tg\n1,,3\n2,,4\n"}, ["replay", "t.csv"], "is empty"),
    ("model info not GGUF", {"m.gguf": b"GGML" + b"\0" * 64}, ["model", "info", "m.gguf"], "not a GGUF"),
    ("model info truncated", {"m.gguf": b"GGUF\x03\0\0\0" + b"\xff" * 16}, ["model", "info", "m.gguf"], "GGUF"),
]


@pytest.mark.parametrize("name, files, argv, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_content_is_one_line_exit_2(tmp_path, name, files, argv, needle):
    for file, content in files.items():
        (tmp_path / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    res = subprocess.run([*CLI, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results")})
    if needle == "":  # refused rows are reported, not fatal: the import goes on without them
        assert res.returncode in (0, 2) and "Traceback" not in res.stderr, res.stderr
        return
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert needle in res.stderr, res.stderr
    for file, content in files.items():  # nothing the user gave was changed
        assert (tmp_path / file).read_bytes() == (content if isinstance(content, bytes) else content.encode())


def test_export_out_refuses_folders_and_overwrites(tmp_path):
    env = {**os.environ, "AUTOINFER_RESULTS": str(tmp_path / "results")}
    table = tmp_path / "t.csv"
    table.write_text(TABLE)
    (tmp_path / "m").write_text("label\n")
    (tmp_path / "c.yaml").write_text(CAMPAIGN + "budget: {trials: 2}\nidle: {policy: 'off'}\ndrift: {every: null}\n"
                                     "confirm: {enabled: false}\nmeasure: {max_cv: null}\n")
    done = subprocess.run([*CLI, "sweep", "c.yaml", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    existing = tmp_path / "best.sh"
    existing.write_text("mine\n")
    for out, needle in ((tmp_path / "missing" / "x.sh", "does not exist"), (tmp_path, "is a folder"),
                        (existing, "add --force")):
        res = subprocess.run([*CLI, "export", "--format", "bench", "--out", str(out)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert existing.read_text() == "mine\n"
    res = subprocess.run([*CLI, "export", "--format", "bench", "--out", str(existing), "--force"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "llama-bench" in existing.read_text(), res.stderr


def _trials(cwd: Path, study: str) -> list[tuple[str, str | None]]:
    import optuna

    loaded = optuna.load_study(study_name=study, storage=f"sqlite:///{cwd / 'results' / 'autoinfer.db'}")
    return [(t.state.name, t.user_attrs.get("outcome")) for t in loaded.trials]


def test_a_replay_model_label_that_is_no_file_runs_and_a_refusal_leaves_no_running_trial(tmp_path):
    (tmp_path / "t.csv").write_text(TABLE)
    (tmp_path / "ok.yaml").write_text(CAMPAIGN.replace("bad", "label") + "budget: {trials: 2}\n")
    done = subprocess.run([*CLI, "sweep", "ok.yaml", "--quiet"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert _trials(tmp_path, "label") == [("COMPLETE", "ok")] * 2
    # the table has a parameter the campaign does not search: found while the first trial runs, it fails that
    # trial with the reason
    (tmp_path / "u.csv").write_text("threads,placement,tg,pp,rss_mib\n1,first,10,100,500\n2,last,12,110,600\n")
    (tmp_path / "refused.yaml").write_text(CAMPAIGN.replace("bad", "refused").replace("t.csv", "u.csv"))
    done = subprocess.run([*CLI, "sweep", "refused.yaml", "--quiet"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "placement" in done.stderr and _trials(tmp_path, "refused") == [("FAIL", "rejected")]
