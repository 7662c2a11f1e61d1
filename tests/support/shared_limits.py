"""Shared limits on Redis: a real redis-server with a password, a key prefix per test, and the gateway as its own
process (several, for limits shared between replicas)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.gateway_harness import Upstream, aifeature, aimodel
from tests.support.polling import wait_until
from tests.support.ports import free_port

KEYS = "team-a: sk-alpha-00000000000000000000000\nteam-b: sk-bravo-00000000000000000000000\n"
PASSWORD = "s3cret-redis-pass"


class RedisServer:
    """A redis-server of the test's own: no persistence, a password, loopback only."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if binary is None:
            if os.environ.get("CI") == "true":
                pytest.fail("redis-server is not installed (scripts/setup.sh installs it): CI must run these tests")
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        argv += ["--save", "", "--appendonly", "no", "--requirepass", PASSWORD]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=PASSWORD, socket_timeout=1)
        try:
            wait_until("redis-server to answer PING", lambda: self._answers(client), 20)
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, "redis-server exited"
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    """Each test's own keys in the shared redis-server."""
    return f"test-{uuid.uuid4().hex[:8]}"


def objects(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    return [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]


class GatewayProcess:
    """A gateway replica as its own process (`python -m servlane_gateway`), so it can die for real."""

    def __init__(
        self, tmp_path: Path, upstreams: dict[str, Upstream], server: RedisServer, prefix: str, limits: dict[str, Any]
    ) -> None:
        routes, keys = tmp_path / "replica-routes.json", tmp_path / "replica-keys"
        routes.write_text(json.dumps(objects(upstreams)))
        keys.write_text(KEYS)
        self.port, metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_base = f"http://127.0.0.1:{metrics_port}"  # /metrics is on its own port
        argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes), "--keys-file", str(keys)]
        argv += [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(metrics_port),
            "--redis-key-prefix",
            prefix,
            "--log-level",
            "warning",
        ]
        for name, value in limits.items():
            argv += ["--" + name.replace("_", "-"), str(value)]
        env = os.environ | {"SERVLANE_GATEWAY_REDIS_URL": server.url}  # as the chart passes it: not in argv
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until("the replica to be ready", self._ready, 60, tolerate=lambda e: isinstance(e, httpx.HTTPError))

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"the replica exited: {self.process.stderr.read().decode() if self.process.stderr else ''}"
            )
        return httpx.get(self.url + "/ready", timeout=2).status_code == 200

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self.process.stderr is not None:
            self.process.stderr.close()
