"""A real PostgreSQL server (the distribution's) for the backbone's store tests and
benchmarks: a throwaway cluster per test session, a fresh database per test."""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_numbers = itertools.count()


def _binaries() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresMissing(RuntimeError):
    pass


@dataclass
class PostgresServer:
    port: int
    user: str = "cotrain"

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a database no test has used."""
        import psycopg

        name = f"test_{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """initdb and start a cluster on a free loopback port (as the `postgres` user when run
    as root: PostgreSQL refuses root); stopped and removed afterwards."""
    binaries = _binaries()
    if binaries is None:
        raise PostgresMissing("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")
    root = Path(tempfile.mkdtemp(prefix="cotrain-postgres-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(root, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, server = root / "data", PostgresServer(free_port())
    try:
        subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(data), "-U", server.user, "-A", "trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
        # fsync off: what these tests check is the backbone's transactions, not this disk.
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -c unix_socket_directories='' -c fsync=off"
        pg_ctl = [*as_user, str(binaries / "pg_ctl"), "-D", str(data)]
        subprocess.run([*pg_ctl, "-l", str(root / "server.log"), "-o", options, "-w", "-t", "60", "start"],
                       check=True, capture_output=True, timeout=90)
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
