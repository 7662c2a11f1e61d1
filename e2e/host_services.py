"""A Redis and a PostgreSQL that the real node's pods reach, as the cluster services a platform team runs and
points the chart at (the chart never runs them). Both come from Debian, installed on this machine (DEVELOPERS.md),
and run here on the host: each listens on the node's address (the address pods route to, localcluster.realnode)
on a free port, with a password, and a Service without a selector plus an EndpointSlice gives it a name in the
cluster (`<name>.<namespace>.svc.cluster.local` on the usual port), as a database outside the cluster gets one.
No image to build or import into the node.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from localcluster.cluster import LocalCluster
from localcluster.realnode import POD_SUBNET
from tests.support.batch_databases import pg_bin
from tests.support.cluster_harness import (
    unavailable,
)
from tests.support.polling import wait_until
from tests.support.ports import free_port

MANAGER = "servlane-e2e"  # the EndpointSlices' endpointslice.kubernetes.io/managed-by: no controller of Kubernetes'


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is not installed (scripts/setup.sh installs it): CI must run the chart's toggles")
    pytest.skip(f"{what} is not installed")


def expose(cluster: LocalCluster, namespace: str, name: str, port: int, address: str, host_port: int) -> str:
    """`name` in `namespace`: a Service without a selector on `port`, whose EndpointSlice is `address`:`host_port`
    (kube-proxy DNATs one to the other). Returns the Service's DNS name."""
    cluster.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        {"metadata": {"name": name}, "spec": {"ports": [{"name": name, "port": port, "targetPort": host_port}]}},
    )
    cluster.api(
        "POST",
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        {
            "metadata": {
                "name": f"{name}-host",
                "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": MANAGER},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": name, "protocol": "TCP", "port": host_port}],
        },
    )
    return f"{name}.{namespace}.svc.cluster.local"


class HostRedis:
    """redis-server on the node's address and loopback: no persistence, a password, `noeviction` (what the
    chart asks of the limits' Redis)."""

    def __init__(self, directory: Path, address: str) -> None:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if binary is None:
            _missing("redis-server")
        assert binary is not None
        self.binary, self.directory, self.address = binary, directory, address
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HostRedis:
        argv = [self.binary, "--port", str(self.port), "--bind", self.address, "127.0.0.1"]
        argv += ["--dir", str(self.directory), "--save", "", "--appendonly", "no", "--requirepass", self.password]
        argv += ["--maxmemory-policy", "noeviction"]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - the process owns it until stop()
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        client = self.client(0)
        try:
            wait_until("redis-server to answer PING", lambda: self._answers(client), 20)
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, (self.directory / "redis.log").read_text()
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def client(self, database: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, db=database, socket_timeout=5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class HostPostgres:
    """A PostgreSQL cluster of the test's own (initdb into `directory`) on the node's address and loopback,
    password (SCRAM) authentication from the pods' subnet, one database `servlane`. Run as the `postgres` user
    when this is root (PostgreSQL refuses root)."""

    DATABASE = "servlane"
    USER = "postgres"

    def __init__(self, directory: Path, address: str) -> None:
        found = pg_bin()
        if found is None:
            _missing("PostgreSQL (initdb, pg_ctl)")
        assert found is not None
        self.bin, self.directory, self.address = found, directory, address
        self.data = directory / "data"
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(directory, account.pw_uid, account.pw_gid)
            self.as_user = {"user": account.pw_uid, "group": account.pw_gid}

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=self.directory, **self.as_user)

    def start(self) -> HostPostgres:
        password_file = self.directory / "password"
        password_file.write_text(self.password + "\n")
        if self.as_user:
            os.chown(password_file, self.as_user["user"], self.as_user["group"])
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", self.USER, "-E", "UTF8",
            "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={password_file}",
        )  # fmt: skip
        password_file.unlink()
        with (self.data / "pg_hba.conf").open("a") as hba:  # initdb's host lines admit loopback only
            hba.write(f"host all all {POD_SUBNET} scram-sha-256\nhost all all {self.address}/32 scram-sha-256\n")
        listen = f"{self.address},127.0.0.1"
        options = f"-p {self.port} -k {self.directory} -c listen_addresses={listen} -c fsync=off"
        log = str(self.directory / "postgres.log")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        wait_until("PostgreSQL to answer", self._answers, 30, tolerate=lambda e: isinstance(e, psycopg.Error))
        with psycopg.connect(self.dsn("127.0.0.1", self.port, "postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.DATABASE}"')
        return self

    def _answers(self) -> bool:
        with psycopg.connect(self.dsn("127.0.0.1", self.port, "postgres"), connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def dsn(self, host: str, port: int, database: str = DATABASE) -> str:
        """postgresql://user:password@host:port/database: what the chart's Secret holds (with the Service's
        name and port), or what the test connects with (loopback and the free port)."""
        return f"postgresql://{self.USER}:{self.password}@{host}:{port}/{database}"

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn("127.0.0.1", self.port), connect_timeout=5)

    def stop(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            cwd=self.directory,
            check=False,
            **self.as_user,
        )


def private_directory(prefix: str) -> Path:
    """A temp dir of this run's own (mode 0700 but chown'd to postgres by HostPostgres when root)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def host_address() -> str:
    """This machine's own non-loopback IPv4 address (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        unavailable("no non-loopback IPv4 address to serve the stub pods on")
    return address
