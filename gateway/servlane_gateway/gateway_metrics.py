"""The gateway's Prometheus collectors, named and labelled exactly as servlane_api.metric_names documents.

Each gateway app owns a registry (so tests can run several side by side); `/metrics` serves it. Every
series carries the route's namespace first, so the canary readers select on namespace and feature.

With several worker processes (servlane_gateway.workers) the values go to prometheus_client's multiprocess
files too (in batches, and all workers' before a scrape: servlane_gateway.worker_metrics), and `/metrics` in
any worker serves the whole pod's sums
(`scrape_registry`). Each gauge says how its processes' values combine (`multiprocess_mode`; ignored with
one process): weights and the limits store are the same in every worker (the most recent / the max), the
in-flight gauges add up over the live ones.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from servlane_api import metric_names as contract
from servlane_core.routing.picking import effective_weights
from servlane_core.routing.routes import Route, RouteTable
from servlane_gateway import worker_metrics
from servlane_gateway.limits.rates import charged_tokens

# The response cache's counters (read by people and dashboards, not by the operator: so named here).
CACHE_HITS = "servlane_gateway_response_cache_hits_total"
CACHE_MISSES = "servlane_gateway_response_cache_misses_total"
CACHE_COALESCED = "servlane_gateway_response_cache_coalesced_total"
CACHE_STORES = "servlane_gateway_response_cache_stores_total"
CACHE_EVICTIONS = "servlane_gateway_response_cache_evictions_total"
# Per pod of a model version (endpoint-aware routing: servlane_gateway.routing.pods).
ENDPOINT_IN_FLIGHT = "servlane_gateway_endpoint_in_flight"
ENDPOINT_PICKS = "servlane_gateway_endpoint_picks_total"
ENDPOINT_EJECTIONS = "servlane_gateway_endpoint_ejections_total"
# Requests held for a model with no ready pod (servlane_gateway.routing.hold): the gateway's own series, so they
# exist while no pod of the model does.
REQUESTS_HELD = "servlane_gateway_requests_held"
HOLD_SECONDS = "servlane_gateway_hold_seconds"
HOLD_REJECTIONS = "servlane_gateway_hold_rejections_total"
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
# The API keys file (servlane_gateway.access): 1 while the file in use parses, 0 while a broken one
# refuses every request; and when it was last (re)loaded, parsed or not.
KEYS_FILE_VALID = "servlane_gateway_keys_file_valid"
KEYS_FILE_LOADED = "servlane_gateway_keys_file_loaded_timestamp_seconds"
# Label value when a request never reached a known route or backend (bounded, unlike client input).
NONE = ""
# Request series started at 0 for every route: success, and the backend 4xx a canary analysis compares
# (a bad chat template or a shorter context: 400; a body over its cap: 413; load shedding: 429), whose first
# occurrence must not go unseen.
DECLARED_CODES = (200, 400, 413, 429)


def exemplar(trace_id: str | None) -> dict[str, str] | None:
    """An observation's link to its trace (OpenMetrics exemplar), when the request was traced."""
    return {"trace_id": trace_id} if trace_id else None


class _PodSums:
    """What a scrape of any worker reports: the multiprocess files' sums, once every worker has written its latest
    values into them (worker_metrics.flush_pod), without the in-flight gauges of workers
    that died, and without the weight series of models no longer routed to: the files cannot drop a series, and a
    dashboard (or a check that the gateway sends a feature to one model only) must not see a rolled-back canary
    linger at 0. Every worker routes by the same table, so the answering worker's is it."""

    def __init__(self, collector: Any, metrics: GatewayMetrics) -> None:
        self.collector = collector
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        worker_metrics.FILES.flush_pod()  # every worker's counts so far written: a scrape counts them all
        worker_metrics.forget_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        for family in self.collector.collect():
            if family.name == contract.WEIGHT:
                current = self.metrics.weighted
                family.samples = [
                    s
                    for s in family.samples
                    if (s.labels.get("namespace"), s.labels.get("feature"), s.labels.get("model")) in current
                ]
            yield family


class Observe:
    """A histogram child's observe() for every request: the same values written as prometheus_client's (the sum,
    then the first bucket whose bound holds the amount), without its per-call checks and its linear scan of the
    buckets (a bisection here). An observation with an exemplar goes through the child's own observe().
    tests/gateway/test_gateway_metrics_fast.py holds it to the library's results."""

    __slots__ = ("_add_to_bucket", "_add_to_sum", "_bounds", "_child")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._add_to_sum = child._sum.inc
        self._add_to_bucket = [bucket.inc for bucket in child._buckets]
        self._bounds = child._upper_bounds

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar:
            self._child.observe(amount, exemplar)
            return
        self._add_to_sum(amount)
        at = bisect_left(self._bounds, amount)  # the last bound is +Inf: always one, but NaN fits none
        if amount <= self._bounds[at]:
            self._add_to_bucket[at](1)


class Increment:
    """A counter child's inc() for every request, without prometheus_client's per-call checks (amounts here are
    counts, never negative)."""

    __slots__ = ("_add",)

    def __init__(self, child: Any) -> None:
        self._add = child._value.inc

    def inc(self, amount: float = 1) -> None:
        self._add(amount)


def _base(name: str, suffix: str) -> str:
    """prometheus_client appends _total to counters itself, so pass it the name without it."""
    return name[: -len(suffix)] if name.endswith(suffix) else name


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Worker processes: values live in the multiprocess files, which cannot drop a series.
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry
        self._add_request_metrics(r)
        self._add_cache_metrics(r)
        self._add_pod_metrics(r)
        self._add_hold_metrics(r)
        # Created by the first keys_file_loaded(): without a keys file there is no file state to report.
        self._keys_file: tuple[Gauge, Gauge] | None = None

        # Label children cached per label values: `.labels()` takes a lock and builds a key on every call,
        # and the values are bounded (route names, models, status codes), so the cache is too.
        self._request_children: dict[tuple[str, str, str, int], Increment] = {}
        self._latency_children: dict[tuple[str, str, str], tuple[Observe, Observe]] = {}
        self._token_children: dict[tuple[str, str, str], tuple[Increment, Increment]] = {}
        self.weighted: set[tuple[str, str, str]] = set()  # (namespace, feature, model) with a weight now
        # What set_weights last wrote, so the next table rewrites only what changed.
        self._shares: dict[tuple[str, str, str], float] = {}
        self._route_shares: dict[tuple[str, str], tuple[Route, dict[str, float]]] = {}
        self._started: set[tuple[str, str, str]] = set()  # request and error series started at 0

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """Requests, latency, tokens, weights and where the limits live."""
        self.requests = Counter(
            _base(contract.REQUESTS, "_total"), "Requests by feature, model and status code.",
            ["namespace", "feature", "model", "code"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            _base(contract.ERRORS, "_total"), "Server-side failures by reason.",
            ["namespace", "feature", "model", "reason"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            contract.LATENCY, "Time from request to the last byte of a successful response.",
            ["namespace", "feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            contract.TTFT,
            "Time from request to the first streamed chunk (the whole answer when not streamed), successes only.",
            ["namespace", "feature", "model"], buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            _base(contract.TOKENS, "_total"), "Tokens reported by the backends' usage.",
            ["namespace", "feature", "model", "kind"], registry=r,
        )  # fmt: skip
        self.added_latency = Histogram(
            contract.ADDED_LATENCY, "Time the gateway itself spends on a request, upstream time excluded.",
            buckets=contract.LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.added = Observe(self.added_latency)  # observed for every request
        self.weight = Gauge(
            contract.WEIGHT, "Percent of a feature's traffic each model gets now (after readiness).",
            ["namespace", "feature", "model"], registry=r, multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.sticky_unpinned = Counter(
            _base(contract.STICKY_UNPINNED, "_total"),
            "Sticky requests routed by weight because their client was over its share of the model's requests.",
            ["namespace", "feature", "model"], registry=r,
        )  # fmt: skip
        self.limits_store = Gauge(
            contract.LIMITS_STORE, "Where rate limits and quotas live: memory (per replica) or redis (shared).",
            ["mode"], registry=r, multiprocess_mode="max",
        )  # fmt: skip

    def _add_cache_metrics(self, r: CollectorRegistry) -> None:
        """The response cache's hits, misses, coalesced answers, stores and evictions."""
        cache = ["namespace", "feature"]
        self.cache_hits = Counter(
            _base(CACHE_HITS, "_total"), "Requests answered from the response cache.", cache, registry=r
        )
        self.cache_misses = Counter(
            _base(CACHE_MISSES, "_total"), "Cacheable requests the response cache did not hold.", cache, registry=r
        )
        self.cache_coalesced = Counter(
            _base(CACHE_COALESCED, "_total"),
            "Requests answered with the answer of an identical request in flight (counted as misses too).",
            cache, registry=r,
        )  # fmt: skip
        self.cache_stores = Counter(
            _base(CACHE_STORES, "_total"), "Answers kept by the response cache.", cache, registry=r
        )
        self.cache_evictions = Counter(
            _base(CACHE_EVICTIONS, "_total"), "Answers dropped from the response cache to make room.", cache,
            registry=r,
        )  # fmt: skip

    def _add_pod_metrics(self, r: CollectorRegistry) -> None:
        """Each pod's requests in flight, picks and ejections."""
        pod = ["namespace", "model", "pod"]
        self.endpoint_in_flight = Gauge(
            ENDPOINT_IN_FLIGHT, "Requests this gateway has in flight to each pod.", pod, registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.endpoint_picks = Counter(
            _base(ENDPOINT_PICKS, "_total"), "Requests sent to each pod (retries included).", pod, registry=r
        )
        self.endpoint_ejections = Counter(
            _base(ENDPOINT_EJECTIONS, "_total"), "Times a pod was ejected for failing (outlier detection).", pod,
            registry=r,
        )  # fmt: skip

    def _add_hold_metrics(self, r: CollectorRegistry) -> None:
        """Requests held for a model with no ready pod."""
        self.requests_held = Gauge(
            REQUESTS_HELD, "Requests held now for a model with no ready pod, waiting for one.",
            ["namespace", "model"], registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.hold_seconds = Histogram(
            HOLD_SECONDS, "How long held requests waited for a ready pod (released, refused or abandoned).",
            ["namespace"], buckets=HOLD_BUCKETS, registry=r,
        )  # fmt: skip
        self.hold_rejections = Counter(
            _base(HOLD_REJECTIONS, "_total"),
            "Requests for a model with no ready pod that were not held (queue full) or stopped being held "
            "(waited too long, model gone), by reason.",
            ["namespace", "reason"], registry=r,
        )  # fmt: skip

    def keys_file_loaded(self, valid: bool, at: float) -> None:
        """The API keys file was (re)loaded at Unix time `at`: parsed (`valid`) or not. Across workers,
        the worst one (min) and the latest load (max)."""
        if self._keys_file is None:
            self._keys_file = (
                Gauge(
                    KEYS_FILE_VALID, "1 while the API keys file parses; 0 while it does not and every request "
                    "is refused.", registry=self.registry, multiprocess_mode="min",
                ),
                Gauge(
                    KEYS_FILE_LOADED, "Unix time the API keys file was last loaded (whether it parsed or not).",
                    registry=self.registry, multiprocess_mode="max",
                ),
            )  # fmt: skip
        state, loaded = self._keys_file
        state.set(1 if valid else 0)
        loaded.set(at)

    def scrape_registry(self) -> CollectorRegistry:
        """What /metrics serves: this registry, or with worker processes (PROMETHEUS_MULTIPROC_DIR set) the
        sums over all of them, so a scrape of the pod sees every request whichever worker answered it."""
        if not self.multiprocess:
            return self.registry
        registry = CollectorRegistry()
        registry.register(_PodSums(MultiProcessCollector(None), self))  # type: ignore[no-untyped-call]
        return registry

    def request_counter(self, namespace: str, feature: str, model: str, code: int) -> Increment:
        key = (namespace, feature, model, code)
        child = self._request_children.get(key)
        if child is None:
            child = Increment(self.requests.labels(namespace, feature, model, str(code)))
            self._request_children[key] = child
        return child

    def latency_histograms(self, namespace: str, feature: str, model: str) -> tuple[Observe, Observe]:
        """(request duration, time to first token) for these labels."""
        key = (namespace, feature, model)
        children = self._latency_children.get(key)
        if children is None:
            children = (Observe(self.latency.labels(*key)), Observe(self.ttft.labels(*key)))
            self._latency_children[key] = children
        return children

    def record(
        self,
        namespace: str,
        feature: str,
        model: str,
        code: int,
        seconds: float,
        error: str | None = None,
        *,
        trace_id: str | None = None,
    ) -> None:
        self.request_counter(namespace, feature, model, code).inc()
        if error is None and code >= 500:
            error = "status_5xx"
        if error is not None:
            self.errors.labels(namespace, feature, model, error).inc()
        elif model != NONE and code < 400:
            # Successes only: a version that fails fast must not look fast (4xx and 499 included).
            self.latency_histograms(namespace, feature, model)[0].observe(seconds, exemplar(trace_id))

    def record_usage(self, namespace: str, feature: str, model: str, usage: object) -> int:
        """Counts prompt/completion tokens from an OpenAI `usage` object; returns the total."""
        if not isinstance(usage, dict):
            return 0
        key = (namespace, feature, model)
        children = self._token_children.get(key)
        if children is None:
            children = (
                Increment(self.tokens.labels(*key, "prompt")),
                Increment(self.tokens.labels(*key, "completion")),
            )
            self._token_children[key] = children
        total = 0
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        # A backend's JSON integer may be of any size; the counters (floats) take up to MAX_CHARGED_TOKENS.
        if isinstance(prompt, int) and prompt > 0:
            prompt = charged_tokens(prompt)
            children[0].inc(prompt)
            total = prompt
        if isinstance(completion, int) and completion > 0:
            completion = charged_tokens(completion)
            children[1].inc(completion)
            total += completion
        return total

    def set_weights(self, table: RouteTable) -> None:
        """Bring the weights gauge to the table's features, touching only the series that changed: it runs on
        the event loop for every table, and a table differs from the last one by the few routes an event
        changed (rewriting all 1,000 features' series stalled every tenant's requests ~60 ms per change).
        Series of routes gone are removed. The request and error series of a feature split over several
        models (a canary, or a fixed split) start at 0: Prometheus' increase() cannot see a series' first
        sample, so a canary's first failures would otherwise go unseen for a whole analysis interval. A feature
        on one model gets its series as its requests come, as any Prometheus client makes them: started for
        every route, 1,000 features made ~45,000 lines of /metrics before a single request, and every scrape
        rendered them all (bench/route_rebuild_bench.py --scrape-every)."""
        shares: dict[tuple[str, str, str], float] = {}
        cached: dict[tuple[str, str], tuple[Route, dict[str, float]]] = {}
        for route in table.routes.values():
            key = (route.namespace, route.name)
            if not route.is_feature or key in cached:
                continue
            previous = self._route_shares.get(key)
            # A route equal to the last table's has the same shares (equality is cheaper than computing them).
            weights = previous[1] if previous is not None and previous[0] == route else effective_weights(route)
            cached[key] = (route, weights)
            for model, share in weights.items():
                shares[(*key, model)] = share
        for labels in self.weighted - shares.keys():
            # Set to 0 before being dropped: with worker processes a dropped series stays in the
            # multiprocess files, and must not keep claiming its last share.
            self.weight.labels(*labels).set(0)
            if not self.multiprocess:
                self.weight.remove(*labels)
        for labels, share in shares.items():
            if self._shares.get(labels) != share:
                self.weight.labels(*labels).set(share)
            if labels not in self._started and len(cached[labels[:2]][1]) > 1:
                self._start_series(*labels)
        self._route_shares = cached
        self._shares = shares
        self.weighted = set(shares)

    def _start_series(self, namespace: str, feature: str, model: str) -> None:
        for code in DECLARED_CODES:
            self.request_counter(namespace, feature, model, code)
        self.latency_histograms(namespace, feature, model)
        for reason in contract.ERROR_REASONS:
            self.errors.labels(namespace, feature, model, reason)
        self._started.add((namespace, feature, model))
