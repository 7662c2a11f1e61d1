"""Histogram quantiles (as Prometheus estimates them), durations, and reading contract metrics text."""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from servlane_api import metric_names as contract
from servlane_core.rollout import MetricsUnavailableError, ModelWindow
from servlane_core.rollout.quantile import bucket_quantile
from servlane_core.rollout.timeutil import from_rfc3339, parse_duration, to_rfc3339
from servlane_operator.metric_readers.prometheus_reader import PrometheusReader
from servlane_operator.metric_readers.scrape_reader import _feature_series

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # 90 observations <= 0.5, 10 in (2.5, 5]: rank 95 is half-way into the (2.5, 5] bucket.
        (0.95, [(0.25, 0), (0.5, 90), (2.5, 90), (5, 100), (INF, 100)], 2.5 + 2.5 * 5 / 10),
        # rank 50 inside the first bucket, which starts at 0.
        (0.5, [(1, 100), (2, 100), (INF, 100)], 0.5),
        # the rank falls into +Inf: the highest finite bound.
        (0.95, [(1, 10), (2, 20), (INF, 100)], 2.0),
        # unordered input and a count that dips (a window straddling a scrape) are tolerated.
        (0.5, [(INF, 4), (2, 3), (1, 4)], 0.5),
        (0.95, [(1, 0), (INF, 0)], None),
        (0.95, [(1, 5)], None),  # no +Inf bucket: not a histogram
    ],
)
def test_bucket_quantile(q: float, buckets: list[tuple[float, float]], expected: float | None) -> None:
    result = bucket_quantile(q, buckets)
    assert result == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("1m30s", 90), ("1.5h", 5400), ("500ms", 0.5)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "1d", "m1", "1m 30s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_rfc3339_round_trip() -> None:
    moment = from_rfc3339("2025-03-01T12:00:07Z")
    assert to_rfc3339(moment) == "2025-03-01T12:00:07Z"


def test_error_rate() -> None:
    assert ModelWindow(requests=0, errors=0).error_rate is None
    assert ModelWindow(requests=40, errors=2).error_rate == pytest.approx(0.05)


def test_feature_series_sums_other_labels_and_keeps_only_the_feature() -> None:
    registry = CollectorRegistry()
    labels = ["namespace", "feature", "model"]
    requests = Counter(contract.REQUESTS, "requests", [*labels, "code"], registry=registry)
    errors = Counter(contract.ERRORS, "errors", [*labels, "reason"], registry=registry)
    latency = Histogram(contract.LATENCY, "latency", labels, buckets=contract.LATENCY_BUCKETS, registry=registry)
    requests.labels("prod", "chat", "b", "200").inc(7)
    requests.labels("prod", "chat", "b", "503").inc(3)
    requests.labels("prod", "chat", "b", "413").inc(4)
    requests.labels("prod", "chat", "b", "429").inc(1)
    requests.labels("prod", "chat", "b", "499").inc(2)  # the client left: not the backend's 4xx
    requests.labels("prod", "other", "b", "200").inc(100)
    requests.labels("staging", "chat", "b", "400").inc(100)  # another namespace's feature of the same name
    errors.labels("prod", "chat", "b", "status_5xx").inc(2)
    errors.labels("prod", "chat", "b", "upstream_timeout").inc(1)
    errors.labels("staging", "chat", "b", "stream_error").inc(50)
    latency.labels("prod", "chat", "b").observe(0.3)
    series = _feature_series(generate_latest(registry).decode(), "prod", "chat")
    assert series[("requests", "b", "")] == 17
    assert series[("errors", "b", "")] == 3
    assert series[("client_errors", "b", "")] == 5
    assert series[("latency", "b", "0.5")] == 1
    assert series[("latency", "b", "0.25")] == 0
    assert series[("latency", "b", "+Inf")] == 1
    assert {key[0] for key in series} == {"requests", "errors", "client_errors", "latency"}


async def test_prometheus_reader_unreachable_raises() -> None:
    # Port 9 (discard) on loopback has no listener here: a real connection refusal.
    reader = PrometheusReader("http://127.0.0.1:9", client=httpx.AsyncClient(timeout=2), job="gateway")
    with pytest.raises(MetricsUnavailableError, match="Prometheus query failed"):
        await reader.read("prod", "chat", ["b"], 60)


class _Refusing(BaseHTTPRequestHandler):
    """A Prometheus that refuses every query (a wrong password, an overload, a query timeout)."""

    status = 401

    def do_GET(self) -> None:  # http.server's name for it
        self.send_response(self.status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None: ...


@pytest.mark.parametrize("status", [401, 503, 422])
async def test_a_refused_query_names_the_server_and_status_never_the_urls_password(status: int) -> None:
    """The message goes to every tenant's AIFeature status, the log and Events: httpx's own text quoted the URL
    with the password of SERVLANE_PROMETHEUS_URL's userinfo."""
    handler = type("Refusing", (_Refusing,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://canary:S3cr3tPassw0rd@127.0.0.1:{server.server_port}/prom"
        reader = PrometheusReader(url, client=httpx.AsyncClient(timeout=5), job="gateway")
        with pytest.raises(MetricsUnavailableError) as failed:
            await reader.read("prod", "chat", ["b"], 60)
        message = str(failed.value)
        assert "S3cr3tPassw0rd" not in message
        assert "canary" not in message
        assert f"HTTP {status}" in message
        assert f"http://127.0.0.1:{server.server_port}" in message
        await reader.aclose()
    finally:
        server.shutdown()
        server.server_close()
