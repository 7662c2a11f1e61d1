"""A real gateway-contract /metrics endpoint: the contract metrics in their own registry, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from modelplane_api import metrics as contract


@dataclass
class GatewayMetrics:
    """The gateway's contract metrics in their own registry, served over HTTP like a gateway pod's."""

    url: str
    requests: Counter
    errors: Counter
    latency: Histogram
    ttft: Histogram

    def declare(self, feature: str, model: str) -> None:
        """Create the series at 0, as a gateway does when it learns a route, so Prometheus sees them start at 0."""
        self.requests.labels(feature, model, "200")
        self.requests.labels(feature, model, "503")
        self.errors.labels(feature, model, "status_5xx")
        self.latency.labels(feature, model)
        self.ttft.labels(feature, model)

    def serve(self, feature: str, model: str, latency: float, ttft: float, error: bool = False) -> None:
        """One finished request. The request counter goes last: once a scrape shows it, it shows the rest."""
        self.latency.labels(feature, model).observe(latency)
        self.ttft.labels(feature, model).observe(ttft)
        if error:
            self.errors.labels(feature, model, "status_5xx").inc()
        self.requests.labels(feature, model, "503" if error else "200").inc()


def serve_gateway_metrics() -> Iterator[GatewayMetrics]:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(
        url="",
        requests=Counter(contract.REQUESTS, "Requests", ["feature", "model", "code"], registry=registry),
        errors=Counter(contract.ERRORS, "Server-side failures", ["feature", "model", "reason"], registry=registry),
        latency=Histogram(
            contract.LATENCY, "Latency", ["feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=registry
        ),
        ttft=Histogram(
            contract.TTFT, "TTFT", ["feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=registry
        ),
    )
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    metrics.url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        yield metrics
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
