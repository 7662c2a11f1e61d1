"""Fixtures: a real gateway-contract /metrics endpoint on loopback, and Debian's real Prometheus scraping it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway_endpoint import GatewayMetrics, serve_gateway_metrics
from tests.support.polling import wait_until

SCRAPE_INTERVAL = "1s"
GATEWAY_JOB, IMPOSTOR_JOB = "gateway", "tenant-pod"
STARTUP_DEADLINE_SECONDS = 60.0


@pytest.fixture
def gateway_metrics() -> Iterator[GatewayMetrics]:
    yield from serve_gateway_metrics()


@pytest.fixture
def second_gateway_metrics() -> Iterator[GatewayMetrics]:
    yield from serve_gateway_metrics()


@pytest.fixture
def impostor_metrics() -> Iterator[GatewayMetrics]:
    """Another target exposing the gateway's metric names (a tenant's pod, say), scraped by its own job."""
    yield from serve_gateway_metrics()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def prometheus(gateway_metrics: GatewayMetrics, impostor_metrics: GatewayMetrics, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping `gateway_metrics` (job `gateway`) and `impostor_metrics` (job `tenant-pod`)
    every second; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        reason = "the prometheus binary is missing: run scripts/install-prometheus.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)

    def job(name: str, metrics: GatewayMetrics) -> str:
        target = metrics.url.removeprefix("http://").removesuffix("/metrics")
        return f"  - job_name: {name}\n    static_configs:\n      - targets: ['{target}']\n"

    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  evaluation_interval: {SCRAPE_INTERVAL}\n"
        f"scrape_configs:\n{job(GATEWAY_JOB, gateway_metrics)}{job(IMPOSTOR_JOB, impostor_metrics)}"
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, process, tmp_path / "prometheus.log")
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            return httpx.get(f"{base_url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("prometheus /-/ready", ready, STARTUP_DEADLINE_SECONDS, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-2000:]}") from None
