"""A real PostgreSQL server for the multi-worker tests: Debian's binaries, a temporary data directory, a free
loopback port, started once per session and stopped at the end. initdb refuses to run as root, so under root the
server runs as the `postgres` user the package creates."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
SERVER_USER = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def postgres_server():
    """(host, port, superuser) of a throwaway PostgreSQL server."""
    if not PG_BINS or not Path(PG_BINS[-1], "initdb").exists():
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    bin_dir = Path(PG_BINS[-1])
    root = Path(tempfile.mkdtemp(prefix="autoinfer-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, SERVER_USER)
        shutil.chown(sockets, SERVER_USER)
    port = _free_port()
    try:
        subprocess.run(_as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "autoinfer",
                                        "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{sockets}'\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")
        subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"),
                                        "-w", "-t", "60", "start"]), check=True, capture_output=True)
        yield "127.0.0.1", port, "autoinfer"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server, request) -> str:
    """A fresh, empty database on the session's server, as an Optuna storage URL."""
    import psycopg2

    host, port, user = postgres_server
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50] + f"_{time.time_ns() % 10**6}"
    conn = psycopg2.connect(host=host, port=port, user=user, dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return f"postgresql://{user}@{host}:{port}/{name}"
