"""/metrics on the gateway's metrics port only (issue #28, item 3).

/metrics lists every namespace's features, models, traffic and trace ids, without an API key: on the API port
any client could read it and no NetworkPolicy could separate it from /v1. So the API port has no /metrics,
and the metrics port serves /metrics and nothing else (admitting a scraper there admits it to no model).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from servlane_api import metric_names as m
from servlane_gateway.flags import parse_settings
from servlane_gateway.http.metrics_listener import MetricsEndpoint
from servlane_gateway.settings import GatewaySettings
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.loop_lag import LoopLag
from tests.support.polling import wait_until
from tests.support.ports import free_port

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gateway(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    return start_gateway([aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])])


def requests_200(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10, headers={"connection": "close"}).text  # any worker may answer
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == m.REQUESTS and s.labels.get("code") == "200" and s.labels.get("feature") == "chat"
    )


def test_the_api_port_has_no_metrics_and_the_metrics_port_has_them(gateway: Gateway) -> None:
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    on_api = httpx.get(f"{gateway.url}/metrics")
    assert on_api.status_code == 404
    assert m.REQUESTS not in on_api.text
    scraped = httpx.get(gateway.metrics_url)
    assert scraped.status_code == 200
    assert f'{m.REQUESTS}{{code="200",feature="chat",model="chat-v1",namespace="default"}} 1.0' in scraped.text
    # OpenMetrics when asked (Prometheus asks): the format that carries exemplars.
    openmetrics = httpx.get(gateway.metrics_url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", "/metrics/../v1/models"),
        ("POST", "/metrics"),
    ],
)
def test_the_metrics_port_serves_nothing_but_metrics(gateway: Gateway, method: str, path: str) -> None:
    metrics_base = gateway.metrics_url.removesuffix("/metrics")
    reply = httpx.request(method, metrics_base + path, json=CHAT if method == "POST" else None, timeout=10)
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"]["code"] == "not_found"
    assert not gateway.sample(m.REQUESTS, feature="chat", model="chat-v1", code="200")  # nothing was proxied


def test_the_metrics_port_is_a_setting_of_its_own() -> None:
    assert GatewaySettings(watch=True).metrics_port == 9090
    assert parse_settings(["--watch", "--metrics-port", "9191"], {}).metrics_port == 9191
    assert parse_settings(["--watch"], {"SERVLANE_GATEWAY_METRICS_PORT": "9292"}).metrics_port == 9292
    with pytest.raises(ValidationError, match="--metrics-port 8080 is the API port"):
        GatewaySettings(watch=True, port=8080, metrics_port=8080)


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def gateway_process(
    request: pytest.FixtureRequest, upstreams: dict[str, Upstream], tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """`python -m servlane_gateway` as the chart runs it: with one process, and with workers that share
    both listening sockets (any of them may answer a scrape, with the pod's sums)."""
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps([aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]))
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--metrics-port", str(metrics_port), "--workers", str(request.param)]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        return httpx.get(url + "/ready", timeout=2).status_code == 200

    try:
        wait_until("the gateway to be ready", ready, 60, tolerate=lambda e: isinstance(e, httpx.HTTPError))
        yield {"url": url, "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}
    finally:
        process.terminate()
        process.wait(20)


def test_a_gateway_process_serves_its_metrics_on_the_metrics_port_only(gateway_process: dict[str, Any]) -> None:
    url, metrics_url = gateway_process["url"], gateway_process["metrics_url"]
    for _ in range(6):  # each on a new connection: with workers, several of them answer
        reply = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10, headers={"connection": "close"})
        assert reply.status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 404
    # Every scrape, whichever worker answers it, reports the pod's sums.
    wait_until("all six requests counted", lambda: requests_200(metrics_url) == 6, 20)
    assert all(requests_200(metrics_url) == 6 for _ in range(6))


class SlowCollector:
    """A collector whose collect() is CPU-bound Python for `seconds`, as rendering thousands of series is."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def collect(self) -> Iterator[Any]:
        deadline = time.perf_counter() + self.seconds
        spins = 0
        while time.perf_counter() < deadline:
            spins += 1
        yield GaugeMetricFamily("spins", "busy loop iterations", value=spins)


async def test_a_slow_scrape_does_not_stall_the_event_loop() -> None:
    """With 1,000 routes a scrape took over a second to render; on the loop, every request of that worker waited
    for it (bench/route_rebuild_bench.py). It is rendered on a thread: the loop keeps getting its turns."""
    registry = CollectorRegistry()
    registry.register(SlowCollector(0.6))
    endpoint = MetricsEndpoint(registry)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": [(b"accept-encoding", b"gzip")]}
    with LoopLag(0.005) as lag:
        await endpoint(scope, receive, send)
    lags = lag.lags
    assert sent[0]["status"] == 200
    assert (b"content-encoding", b"gzip") in sent[0]["headers"]
    assert b"spins " in gzip.decompress(sent[1]["body"])
    assert len(lags) > 10, lags  # the loop ran all along
    assert max(lags) < 0.3, max(lags)  # never stalled for the render (0.6 s; the GIL's turns are 5 ms)
