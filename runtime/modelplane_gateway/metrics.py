"""The gateway's Prometheus collectors, named and labelled exactly as modelplane_api.metrics documents.

Each gateway app owns a registry (so tests can run several side by side); `/metrics` serves it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from modelplane_api import metrics as contract
from modelplane_gateway.picking import effective_weights
from modelplane_gateway.routes import RouteTable

# Label value when a request never reached a known route or backend (bounded, unlike client input).
NONE = ""


def _base(name: str, suffix: str) -> str:
    """prometheus_client appends _total to counters itself, so pass it the name without it."""
    return name[: -len(suffix)] if name.endswith(suffix) else name


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            _base(contract.REQUESTS, "_total"), "Requests by feature, model and status code.",
            ["feature", "model", "code"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            _base(contract.ERRORS, "_total"), "Server-side failures by reason.",
            ["feature", "model", "reason"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            contract.LATENCY, "Time from request to the last byte of the response.",
            ["feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            contract.TTFT, "Time from request to the first streamed chunk (the whole answer when not streamed).",
            ["feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            _base(contract.TOKENS, "_total"), "Tokens reported by the backends' usage.",
            ["feature", "model", "kind"], registry=r,
        )  # fmt: skip
        self.added_latency = Histogram(
            contract.ADDED_LATENCY, "Time the gateway itself spends on a request, upstream time excluded.",
            buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.weight = Gauge(
            contract.WEIGHT, "Percent of a feature's traffic each model gets now (after readiness).",
            ["feature", "model"], registry=r,
        )  # fmt: skip

        # Label children cached per label values: `.labels()` takes a lock and builds a key on every call,
        # and the values are bounded (route names, models, status codes), so the cache is too.
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._latency_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def request_counter(self, feature: str, model: str, code: int) -> Any:
        child = self._request_children.get((feature, model, code))
        if child is None:
            child = self._request_children[(feature, model, code)] = self.requests.labels(feature, model, str(code))
        return child

    def latency_histograms(self, feature: str, model: str) -> tuple[Any, Any]:
        """(request duration, time to first token) for these labels."""
        children = self._latency_children.get((feature, model))
        if children is None:
            children = (self.latency.labels(feature, model), self.ttft.labels(feature, model))
            self._latency_children[(feature, model)] = children
        return children

    def record(self, feature: str, model: str, code: int, seconds: float, error: str | None = None) -> None:
        self.request_counter(feature, model, code).inc()
        if error is None and code >= 500:
            error = "status_5xx"
        if error is not None:
            self.errors.labels(feature, model, error).inc()
        if model != NONE:
            self.latency_histograms(feature, model)[0].observe(seconds)

    def record_usage(self, feature: str, model: str, usage: object) -> int:
        """Counts prompt/completion tokens from an OpenAI `usage` object; returns the total."""
        if not isinstance(usage, dict):
            return 0
        total = 0
        for kind in ("prompt", "completion"):
            value = usage.get(f"{kind}_tokens")
            if isinstance(value, int) and value > 0:
                self.tokens.labels(feature, model, kind).inc(value)
                total += value
        return total

    def set_weights(self, table: RouteTable) -> None:
        """Replace the weights gauge with the table's features (stale series removed), and start every
        route's request and error series at 0: Prometheus' increase() cannot see a series' first sample,
        so a canary's first failures would otherwise go unseen for a whole analysis interval."""
        self.weight.clear()
        seen: set[str] = set()
        for route in table.routes.values():
            if not route.is_feature or route.name in seen:
                continue
            seen.add(route.name)
            for model, share in effective_weights(route).items():
                self.weight.labels(route.name, model).set(share)
            for backend in route.backends:
                self.request_counter(route.name, backend.model, 200)
                self.latency_histograms(route.name, backend.model)
                for reason in contract.ERROR_REASONS:
                    self.errors.labels(route.name, backend.model, reason)
