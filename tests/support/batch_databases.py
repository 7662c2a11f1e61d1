"""Databases for the Batch API's tests: a real PostgreSQL of the tests' own (initdb into a temp dir, on a
free port, its unix socket in that dir; one per test session) and SQLite files.

Run as root (a container), PostgreSQL refuses to start, so its processes run as the `postgres` user then.
On CI a missing PostgreSQL fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.polling import wait_until
from tests.support.ports import free_port

PG_BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14)]


def pg_bin() -> Path | None:
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    return next((d for d in PG_BIN_DIRS if (d / "initdb").exists()), None)


class Postgres:
    def __init__(self, directory: Path) -> None:
        found = pg_bin()
        if found is None:
            if os.environ.get("CI") == "true":
                pytest.fail("PostgreSQL (initdb, pg_ctl) is not installed: CI must run the Batch API's database tests")
            pytest.skip("PostgreSQL is not installed")
        self.bin = found
        self.directory = directory
        self.data = directory / "data"
        self.port = free_port()
        self.user: dict[str, Any] = {}
        if os.geteuid() == 0:  # postgres will not run as root
            account = pwd.getpwnam("postgres")
            os.chown(directory, account.pw_uid, account.pw_gid)
            self.user = {"user": account.pw_uid, "group": account.pw_gid}

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=self.directory, **self.user)

    def start(self) -> Postgres:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.directory / "postgres.log")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        wait_until("PostgreSQL to answer", self._answers, 30, tolerate=lambda e: isinstance(e, psycopg.Error))
        return self

    def _answers(self) -> bool:
        with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.directory}&port={self.port}"

    def url(self, database: str) -> str:
        """As a user sets it (the gateway picks psycopg 3 for postgresql://)."""
        return self.dsn(database)

    def new_database(self, name: str) -> str:
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            cwd=self.directory,
            **self.user,
        )


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    # As root, pytest's temp dirs (mode 0700, root's) are closed to the postgres user: a dir of its own then.
    own = os.geteuid() == 0
    directory = Path(tempfile.mkdtemp(prefix="servlane-pg-")) if own else tmp_path_factory.mktemp("postgres")
    server = Postgres(directory)
    try:
        yield server.start()
    finally:
        server.stop()
        if own:
            shutil.rmtree(directory, ignore_errors=True)
