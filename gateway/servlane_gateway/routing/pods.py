"""Endpoint-aware routing: the gateway picks the pod itself instead of leaving it to kube-proxy.

The weights pick a model version (an AIModel); its Service's EndpointSlices list its pods. Through a
Service, kube-proxy picks a pod blind to its load and to what its KV cache holds; here the feature's
policy (spec.routing: servlane_core.routing.endpoint_pick) picks among the ready pods by the requests
this gateway has in flight to each, or by prompt prefix, and pods that keep failing are ejected for a
while (servlane_core.routing.outliers). The decisions are pure and live in servlane_core.routing; this
module holds the in-flight counts and the metrics; the EndpointSlice watch is routing.slices.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace

from servlane_core.routing.bounded_hashing import pick_bounded, ring_of
from servlane_core.routing.endpoint_pick import (
    PREFIX_AFFINITY,
    ROUND_ROBIN,
    Endpoint,
    RoundRobin,
    candidates,
    least_loaded,
    service_of,
)
from servlane_core.routing.outliers import OutlierDetector, OutlierRules
from servlane_core.routing.routes import Backend
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.routing.slices import ServiceKey, Services

log = logging.getLogger(__name__)

# How long a pod whose /ready answered 200 takes requests while its slice still says not ready: past the
# kubelet's readiness probe (every 5 s) and the slice update, after which the slice's word stands.
PROBED_READY_SECONDS = 30.0


@functools.lru_cache(maxsize=4096)
def _service_key(base_url: str) -> ServiceKey | None:
    return service_of(base_url)


class Lease:
    """One attempt on one target (a pod, or the Service URL): counted in flight until released."""

    def __init__(self, router: PodRouter, backend: Backend, endpoint: Endpoint | None) -> None:
        self.router = router
        self.backend = backend
        self.endpoint = endpoint
        self.base_url = endpoint.base_url if endpoint is not None else backend.base_url
        self.key = endpoint.address if endpoint is not None else backend.base_url  # what `exclude` holds
        self._released = False
        self._judged = False

    def answered(self, status: int | None) -> None:
        """The attempt's outcome for outlier detection, once: the answer's status, or None when the pod
        refused or reset the connection before answering."""
        if not self._judged:
            self._judged = True
            self.router._judge(self, status)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.router._release(self)


class PodRouter:
    """Picks the pod for each attempt; lives on the event loop (no locks)."""

    def __init__(
        self,
        metrics: GatewayMetrics | None = None,
        rules: OutlierRules | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics = metrics
        self.services: Services = {}
        self._present: frozenset[str] = frozenset()  # every address in the slices
        self.in_flight: Counter[str] = Counter()
        self.outliers = OutlierDetector(rules)
        self.round_robin = RoundRobin()
        self.clock = clock
        self.rng = rng or random.Random()
        self._series: dict[str, tuple[str, str, str]] = {}  # address -> metric labels in use
        # Pods (addresses) the slices list as not ready yet whose runtime's /ready answered 200 when asked
        # (servlane_gateway.routing.hold), and backends without slices (called at their URL) likewise: since when.
        # They take requests before the kubelet's next readiness probe says so, for PROBED_READY_SECONDS.
        self._probed_pods: dict[str, float] = {}
        self._probed_urls: dict[str, float] = {}

    def update(self, services: Services) -> None:
        """A new view of the slices: takes effect for the next pick."""
        self.services = services
        present = self._present = frozenset(e.address for endpoints in services.values() for e in endpoints)
        self.outliers.forget(present)
        if self._probed_pods:  # the slices caught up (or the pod left): their word stands from now on
            settled = {e.address for endpoints in services.values() for e in endpoints if e.ready or e.terminating}
            for address in [a for a in self._probed_pods if a not in present or a in settled]:
                del self._probed_pods[address]
        for address in [a for a in self._series if a not in present and not self.in_flight[a]]:
            self._drop_series(address)

    def endpoints_of(self, backend: Backend) -> tuple[Endpoint, ...] | None:
        key = _service_key(backend.base_url) if backend.base_url else None
        return self.services.get(key) if key is not None else None

    def is_live(self, backend: Backend) -> bool:
        """Whether `backend` has a pod to take a request now: one its slices say is ready, or one whose
        /ready answered 200 (mark_probed); without slices, its URL's /ready answered 200."""
        endpoints = self.endpoints_of(backend)
        if endpoints is None:
            return self._probed_recently(self._probed_urls.get(backend.base_url))
        return any(e.eligible or self._probed_pod(e) for e in endpoints)

    def probe_targets(self, backend: Backend) -> list[tuple[str, str]]:
        """(key, base URL) of each target whose /ready to ask while requests wait for `backend`: the pods
        its slices list as not ready yet and not terminating; without slices, its URL."""
        endpoints = self.endpoints_of(backend)
        if endpoints is None:
            return [(backend.base_url, backend.base_url)] if backend.base_url else []
        return [(e.address, e.base_url) for e in endpoints if not e.ready and not e.terminating]

    def mark_probed(self, backend: Backend, key: str) -> None:
        """A probe target of `backend` (a key from probe_targets) answered /ready with 200."""
        probed = self._probed_urls if self.endpoints_of(backend) is None else self._probed_pods
        probed[key] = self.clock()

    def _probed_pod(self, endpoint: Endpoint) -> bool:
        return not endpoint.terminating and self._probed_recently(self._probed_pods.get(endpoint.address))

    def _probed_recently(self, at: float | None) -> bool:
        return at is not None and self.clock() - at < PROBED_READY_SECONDS

    def choose(self, backend: Backend, policy: str, prefix: str | None, exclude: Collection[str] = ()) -> Lease | None:
        """The target of the next attempt on `backend`, counted in flight; None when every target of it
        was tried already (`exclude` holds the tried leases' keys)."""
        endpoints = self.endpoints_of(backend)
        eligible = [e for e in endpoints or () if e.eligible]
        if self._probed_pods and endpoints:
            eligible += [replace(e, ready=True) for e in endpoints if not e.eligible and self._probed_pod(e)]
        if not eligible:  # nothing known, or nothing ready: the Service URL, as without slices
            return None if backend.base_url in exclude else self._start(Lease(self, backend, None))
        now = self.clock()
        ejected = self.outliers.ejected((e.address for e in eligible), now)
        options = candidates(eligible, ejected, exclude)
        if not options:
            return None
        if policy == PREFIX_AFFINITY and prefix:
            ring = ring_of(tuple(e.address for e in endpoints or ()))
            picked = pick_bounded(ring, prefix, options, self.in_flight, rng=self.rng)
        elif policy == ROUND_ROBIN:
            picked = self.round_robin.pick(backend.base_url, options)
        else:
            picked = least_loaded(options, self.in_flight, self.rng)
        return self._start(Lease(self, backend, picked)) if picked is not None else None

    def _labels(self, lease: Lease) -> tuple[str, str, str] | None:
        if lease.endpoint is None:
            return None
        labels = (lease.backend.namespace, lease.backend.model, lease.endpoint.pod)
        self._series[lease.endpoint.address] = labels
        return labels

    def _start(self, lease: Lease) -> Lease:
        if lease.endpoint is not None:
            self.in_flight[lease.endpoint.address] += 1
            labels = self._labels(lease)
            if self.metrics is not None and labels is not None:
                self.metrics.endpoint_picks.labels(*labels).inc()
                self.metrics.endpoint_in_flight.labels(*labels).inc()
        return lease

    def _release(self, lease: Lease) -> None:
        endpoint = lease.endpoint
        if endpoint is None:
            return
        address = endpoint.address
        self.in_flight[address] -= 1
        if self.in_flight[address] <= 0:
            del self.in_flight[address]
        labels = self._series.get(address)
        if self.metrics is not None and labels is not None:
            self.metrics.endpoint_in_flight.labels(*labels).dec()
        if address not in self.in_flight and address not in self._present:
            self._drop_series(address)  # the pod left while this request was on it

    def _judge(self, lease: Lease, status: int | None) -> None:
        endpoint = lease.endpoint
        if endpoint is None:
            return
        now = self.clock()
        if status is not None and status < 500:
            self.outliers.record_success(endpoint.address, now)
            return
        group = [e.address for e in self.endpoints_of(lease.backend) or () if e.eligible]
        if self.outliers.record_failure(endpoint.address, group, now):
            log.warning(
                "pod %s of %s/%s ejected after consecutive failures", endpoint.pod, lease.backend.namespace,
                lease.backend.model,
            )  # fmt: skip
            labels = self._series.get(endpoint.address)
            if self.metrics is not None and labels is not None:
                self.metrics.endpoint_ejections.labels(*labels).inc()

    def _drop_series(self, address: str) -> None:
        labels = self._series.pop(address, None)
        # Worker processes' files cannot drop a series (prometheus_client's multiprocess mode): it stays.
        if self.metrics is None or labels is None or self.metrics.multiprocess:
            return
        metrics = self.metrics
        for collector in (metrics.endpoint_in_flight, metrics.endpoint_picks, metrics.endpoint_ejections):
            with contextlib.suppress(KeyError):  # a series never written
                collector.remove(*labels)
