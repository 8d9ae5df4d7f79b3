"""A storage password never reaches a process list, an error message or a log."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil
import pytest
from test_workers import CLI, replay_campaign

from autoinfer.store.redact import redact, redact_url

SECRET = "s3cretPW"


@pytest.mark.parametrize("text, shown", [
    ("postgresql://u:s3cretPW@db:5432/x", "postgresql://u:***@db:5432/x"),
    ("error: cannot open storage 'postgresql://u:p@ss@h/db': refused", "error: cannot open storage "
                                                                        "'postgresql://u:***@h/db': refused"),
    ("postgresql+psycopg2://u:pw@h/db and mysql://a:b@c/d", "postgresql+psycopg2://u:***@h/db and mysql://a:***@c/d"),
    ("postgresql://h/db?user=u&password=pw&sslmode=require", "postgresql://h/db?user=u&password=***&sslmode=require"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("sqlite:////tmp/a b/autoinfer.db", "sqlite:////tmp/a b/autoinfer.db"),
])
def test_redaction(text, shown):
    assert redact(text) == shown
    assert redact_url(None) == ""


def _watch_argv(parent: subprocess.Popen, seen: list[str], stop: threading.Event) -> None:
    """Every command line of the parent's descendants, as `ps` shows it to any user. A child caught between fork
    and exec still shows the parent's own command line (which the test typed); that one is not the child's."""
    own = " ".join(parent.args)
    while not stop.is_set():
        try:
            for child in psutil.Process(parent.pid).children(recursive=True):
                argv = " ".join(child.cmdline())
                if argv != own:
                    seen.append(argv)
        except psutil.Error:
            pass
        time.sleep(0.01)


def test_workers_started_per_gpu_get_the_url_outside_argv(tmp_path, pg_url):
    url = pg_url.replace("@", f":{SECRET}@", 1)  # trust auth: the password is ignored
    assert SECRET in url
    campaign = replay_campaign(tmp_path, trials=4, name="secret")
    seen: list[str] = []
    stop = threading.Event()
    parent = subprocess.Popen([*CLI, "worker", str(campaign), "--study", "secret", "--storage", url,
                               "--gpus", "0,1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=_watch_argv, args=(parent, seen, stop))
    watcher.start()
    try:
        out, err = parent.communicate(timeout=300)
    finally:
        stop.set()
        watcher.join()
    assert parent.returncode == 0, out + err
    workers = [argv for argv in seen if " worker " in argv]
    assert workers, "no worker child was seen"
    assert not [argv for argv in seen if SECRET in argv]
    assert SECRET not in out + err


@pytest.mark.parametrize("url", [f"postgresql://u:{SECRET}@127.0.0.1:1/none", f"mysql://u:{SECRET}@h/db"])
def test_storage_errors_never_show_the_password(tmp_path, url):
    campaign = replay_campaign(tmp_path, trials=1)
    for argv in (["worker", str(campaign), "--study", "x", "--storage", url],
                 ["status", "--storage", url], ["export", "--storage", url], ["sweep", str(campaign), "--storage", url]):
        res = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, (argv, res.stderr)
        assert SECRET not in res.stdout + res.stderr and "***" in res.stderr, (argv, res.stderr)
        assert res.stderr.count("\n") == 1, res.stderr
