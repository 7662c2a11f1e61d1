"""A real gateway-contract /metrics endpoint: the contract metrics in their own registry, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from servlane_api import metric_names as contract

LABELS = ["namespace", "feature", "model"]


@dataclass
class GatewayMetrics:
    """The gateway's contract metrics in their own registry, served over HTTP like a gateway pod's."""

    url: str
    requests: Counter
    errors: Counter
    latency: Histogram
    ttft: Histogram

    def declare(self, feature: str, model: str, namespace: str = "prod") -> None:
        """Create the series at 0, as a gateway does when it learns a route, so Prometheus sees them start at 0."""
        for code in ("200", "429", "499", "503"):
            self.requests.labels(namespace, feature, model, code)
        self.errors.labels(namespace, feature, model, "status_5xx")
        self.latency.labels(namespace, feature, model)
        self.ttft.labels(namespace, feature, model)

    def serve(
        self, feature: str, model: str, latency: float, ttft: float, error: bool = False, namespace: str = "prod"
    ) -> None:
        """One finished request. The request counter goes last: once a scrape shows it, it shows the rest.
        As the gateway does, only successes are observed in the latency histograms."""
        if error:
            self.errors.labels(namespace, feature, model, "status_5xx").inc()
        else:
            self.latency.labels(namespace, feature, model).observe(latency)
            self.ttft.labels(namespace, feature, model).observe(ttft)
        self.requests.labels(namespace, feature, model, "503" if error else "200").inc()

    def answer(self, feature: str, model: str, code: str, namespace: str = "prod") -> None:
        """A request answered with `code` and no latency observed: a backend 4xx, or 499 (client gone)."""
        self.requests.labels(namespace, feature, model, code).inc()


def serve_gateway_metrics() -> Iterator[GatewayMetrics]:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(
        url="",
        requests=Counter(contract.REQUESTS, "Requests", [*LABELS, "code"], registry=registry),
        errors=Counter(contract.ERRORS, "Server-side failures", [*LABELS, "reason"], registry=registry),
        latency=Histogram(contract.LATENCY, "Latency", LABELS, buckets=contract.LATENCY_BUCKETS, registry=registry),
        ttft=Histogram(contract.TTFT, "TTFT", LABELS, buckets=contract.LATENCY_BUCKETS, registry=registry),
    )
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    metrics.url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        yield metrics
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
