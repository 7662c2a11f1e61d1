"""A gateway started with a low soft limit on open files (containerd 2 under systemd gives containers 1024)
holds connections past it: it raises its soft limit to the hard one before its workers start
(servlane_web.open_files). Without that, a worker past its limit resets every new connection, so one client
holding connections locks out every other."""

from __future__ import annotations

import asyncio
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servlane_web.open_files import raise_open_files_limit
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.worker_processes import worker_pids

STARTED_WITH = 256  # the gateway's soft limit at its start
CONNECTIONS = 700  # held at once: more than two workers could hold at STARTED_WITH


def soft_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open files limit for {pid}")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], int]]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 * CONNECTIONS + 100:
        pytest.fail(f"this machine's hard limit on open files ({hard}) is below what the test holds")
    routes = tmp_path / "routes.json"
    routes.write_text("[]")
    port = free_port()
    argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes), "--workers", "2"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port())]

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (STARTED_WITH, hard))

    process = subprocess.Popen(argv, preexec_fn=low_soft_limit, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the gateway exited: {process.stderr.read().decode() if process.stderr else ''}")
            return len(worker_pids(process.pid)) == 2 and httpx.get(url + "/health", timeout=2).status_code == 200

        wait_until("the gateway's two workers", ready, 60, tolerate=lambda e: isinstance(e, httpx.HTTPError))
        yield url, process, hard
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


async def hold_and_ask(port: int, count: int) -> list[bytes]:
    """Opens `count` connections and keeps them all open, then asks for /health on each; each one's status
    line (b"" when the connection was reset or closed instead)."""
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    try:

        async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            try:
                writer.write(b"GET /health HTTP/1.1\r\nhost: gateway\r\n\r\n")
                await writer.drain()
                return await asyncio.wait_for(reader.readline(), 20)
            except (ConnectionError, TimeoutError):
                return b""

        return await asyncio.gather(*(ask(r, w) for r, w in connections))
    finally:
        for _, writer in connections:
            writer.close()


def test_a_gateway_started_with_a_low_open_files_limit_holds_connections_past_it(
    gateway: tuple[str, subprocess.Popen[bytes], int],
) -> None:
    url, process, hard = gateway
    assert raise_open_files_limit() >= 2 * CONNECTIONS  # this test's own side of the connections
    for pid in [process.pid, *worker_pids(process.pid)]:
        assert soft_open_files(pid) == hard
    answers = asyncio.run(hold_and_ask(int(url.rsplit(":", 1)[1]), CONNECTIONS))
    refused = [a for a in answers if not a.startswith(b"HTTP/1.1 200")]
    assert not refused, f"{len(refused)} of {CONNECTIONS} connections not served: {set(refused)}"
    assert httpx.get(url + "/health", timeout=5).status_code == 200
