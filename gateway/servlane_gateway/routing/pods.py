"""Endpoint-aware routing: the gateway picks the pod itself instead of leaving it to kube-proxy.

The weights pick a model version (an AIModel); its Service's EndpointSlices list its pods. Through a
Service, kube-proxy picks a pod blind to its load and to what its KV cache holds; here the feature's
policy (spec.routing: servlane_core.routing.endpoint_pick) picks among the ready pods by the requests
this gateway has in flight to each, or by prompt prefix, and pods that keep failing are ejected for a
while (servlane_core.routing.outliers). The decisions are pure and live in servlane_core.routing; this
module holds the watch, the in-flight counts and the metrics.

The watch: EndpointSlices labelled with `kubernetes.io/service-name`, the operator's `servlane.dev/model`
(the EndpointSlice controller copies a Service's labels onto its slices, so only the AIModels' slices
come, never the whole cluster's) and the controller's own `endpointslice.kubernetes.io/managed-by`, one
thread per namespace stream with the same list and watch loop as the route source
(kube_watch.watch_forever). Of those, only the slices the control plane keeps for an AIModel's own
Service count (is_model_slice): a slice anyone wrote by hand could otherwise list another team's pods,
or any address in the cluster, as an AIModel's. A backend's Service is read from its cluster-DNS URL
(`http://model-<aimodel>.<namespace>.svc...`, built from the AIModel's own name and namespace). A backend
with no slice known (routes-file mode, an endpoint override, a Service not seen yet) or with no ready
pod is called at its URL, as before: kube-proxy then picks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from servlane_api.children import child_name
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
from servlane_gateway.routing.kube_watch import Resource, custom_objects_api, watch_forever

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MODEL_LABEL = "servlane.dev/model"  # on the operator's Services, hence on their slices
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"  # the control plane's, for Services with a selector
SLICE_SELECTOR = f"{SERVICE_NAME_LABEL},{MODEL_LABEL},{MANAGED_BY_LABEL}={SLICE_CONTROLLER}"
SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", SLICE_SELECTOR)
PORT_NAME = "http"  # the operator's Service port
# How long a pod whose /ready answered 200 takes requests while its slice still says not ready: past the
# kubelet's readiness probe (every 5 s) and the slice update, after which the slice's word stands.
PROBED_READY_SECONDS = 30.0
ServiceKey = tuple[str, str]  # (namespace, service)
Services = dict[ServiceKey, tuple[Endpoint, ...]]


def slice_endpoints(obj: dict[str, Any]) -> list[Endpoint]:
    """The endpoints of one EndpointSlice at its `http` port (else its only port). Conditions as the API
    documents them: `ready` unset means ready, `terminating` unset means not terminating."""
    if obj.get("addressType") not in ("IPv4", "IPv6"):
        return []
    ports = [p for p in obj.get("ports") or [] if isinstance(p, dict)]
    named = [p for p in ports if p.get("name") == PORT_NAME]
    port = (named or ports)[0].get("port") if (named or len(ports) == 1) else None
    if not isinstance(port, int):
        return []
    found: list[Endpoint] = []
    for entry in obj.get("endpoints") or []:
        addresses = entry.get("addresses") or []
        if not addresses:
            continue
        ip = str(addresses[0])
        address = f"[{ip}]:{port}" if obj.get("addressType") == "IPv6" else f"{ip}:{port}"
        conditions = entry.get("conditions") or {}
        ref = entry.get("targetRef") or {}
        pod = str(ref.get("name")) if ref.get("kind", "Pod") == "Pod" and ref.get("name") else address
        ready = conditions.get("ready") is not False
        found.append(Endpoint(address, pod, ready, conditions.get("terminating") is True))
    return found


def is_model_slice(obj: dict[str, Any]) -> bool:
    """Whether a slice lists an AIModel's pods: kept by the control plane's EndpointSlice controller
    (which lists only the pods its Service selects, in its own namespace), for the Service named after
    the AIModel (`kubernetes.io/service-name` is `model-<servlane.dev/model>`), and owned by that Service.
    A slice anyone else wrote (by hand, or by the mirroring controller for a Service without a selector,
    whose addresses anyone may choose) is not."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    service, model = labels.get(SERVICE_NAME_LABEL), labels.get(MODEL_LABEL)
    if labels.get(MANAGED_BY_LABEL) != SLICE_CONTROLLER or not isinstance(model, str) or not model:
        return False
    if service != child_name(model):
        return False
    owners = meta.get("ownerReferences") or []
    return any(
        isinstance(owner, dict)
        and owner.get("apiVersion") == "v1"
        and owner.get("kind") == "Service"
        and owner.get("name") == service
        and owner.get("controller") is True
        for owner in owners
    )


def services_of(slices: Sequence[dict[str, Any]]) -> Services:
    """Every Service's endpoints from its slices; an address in two slices (mid-update) counts once, as
    eligible if either says so."""
    merged: dict[ServiceKey, dict[str, Endpoint]] = {}
    for obj in slices:
        meta = obj.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not service:
            continue
        into = merged.setdefault((str(meta.get("namespace", "default")), str(service)), {})
        for endpoint in slice_endpoints(obj):
            known = into.get(endpoint.address)
            if known is None or (endpoint.eligible and not known.eligible):
                into[endpoint.address] = endpoint
    return {key: tuple(sorted(found.values(), key=lambda e: e.address)) for key, found in merged.items()}


OnServices = Callable[[Services], None]
SliceKey = tuple[str, str]  # (namespace, slice name)


def _keys_of(obj: dict[str, Any]) -> tuple[SliceKey, ServiceKey | None]:
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace", "default"))
    service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return (namespace, str(meta.get("name", ""))), ((namespace, str(service)) if service else None)


class SliceIndex:
    """The AIModels' Services' endpoints, kept one slice event at a time on the watch threads: an event
    merges only its own Service's slices again, never the whole cluster's, and a change that leaves that
    Service's endpoints as they were (a label, an annotation, a resourceVersion) changes nothing. Only the
    slices the control plane keeps for an AIModel's Service are indexed (is_model_slice). Thread-safe."""

    def __init__(self, streams: Sequence[tuple[str, str]]) -> None:
        self._slices: dict[tuple[str, str], dict[SliceKey, tuple[ServiceKey, dict[str, Any]]]] = {
            s: {} for s in streams
        }
        self._members: dict[ServiceKey, dict[SliceKey, dict[str, Any]]] = {}
        self._services: Services = {}
        self._lock = threading.Lock()

    def replace(self, stream: tuple[str, str], items: list[dict[str, Any]]) -> bool:
        """A fresh list of the stream (first sync, or a relist); True when any Service's endpoints changed."""
        with self._lock:
            touched = {service for service, _ in self._slices[stream].values()}
            for key, (service, _) in self._slices[stream].items():
                self._members[service].pop(key, None)
            self._slices[stream] = {}
            for obj in items:
                touched |= self._put(stream, obj)
            return self._merge(touched)

    def apply(self, stream: tuple[str, str], event_type: str, obj: dict[str, Any]) -> bool:
        """One watch event; True when it changed a Service's endpoints."""
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return False  # BOOKMARK and the like
        with self._lock:
            key, _ = _keys_of(obj)
            touched: set[ServiceKey] = set()
            known = self._slices[stream].pop(key, None)
            if known is not None:
                self._members[known[0]].pop(key, None)
                touched.add(known[0])
            if event_type != "DELETED":
                touched |= self._put(stream, obj)
            return self._merge(touched)

    def services(self) -> Services:
        with self._lock:
            return dict(self._services)

    def _put(self, stream: tuple[str, str], obj: dict[str, Any]) -> set[ServiceKey]:
        key, service = _keys_of(obj)
        if service is None or not is_model_slice(obj):
            return set()
        self._slices[stream][key] = (service, obj)
        self._members.setdefault(service, {})[key] = obj
        return {service}

    def _merge(self, touched: set[ServiceKey]) -> bool:
        changed = False
        for service in touched:
            members = self._members.get(service) or {}
            endpoints = services_of(list(members.values())).get(service)
            if not members:
                self._members.pop(service, None)
            if endpoints != self._services.get(service):
                changed = True
                if endpoints is None:
                    del self._services[service]
                else:
                    self._services[service] = endpoints
        return changed


class EndpointSliceSource:
    """Watches the AIModels' EndpointSlices and hands every change, coalesced, to the event loop. The
    merging is done on the watch threads (SliceIndex): the loop only receives the result."""

    def __init__(self, namespaces: Sequence[str] = (), watch_timeout_seconds: int = 240) -> None:
        self.streams = [("endpointslices", ns) for ns in (namespaces or [""])]
        self.store = SliceIndex(self.streams)
        self.watch_timeout_seconds = watch_timeout_seconds
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_services: OnServices | None = None
        self._pending = False
        self._lock = threading.Lock()

    async def start(self, on_services: OnServices) -> None:
        api = custom_objects_api()
        self.start_publishing(on_services)
        for stream in self.streams:
            threading.Thread(target=self._run, args=(api, stream), name="watch-endpointslices", daemon=True).start()

    def start_publishing(self, on_services: OnServices) -> None:
        """From now on, changes are handed to `on_services` on this (the running) event loop."""
        self._loop = asyncio.get_running_loop()
        self._on_services = on_services

    async def stop(self) -> None:
        self._stop.set()

    def listed(self, stream: tuple[str, str], items: list[dict[str, Any]]) -> None:
        self.store.replace(stream, items)
        self._schedule()  # even unchanged: the first list tells the router the watch is up

    def changed(self, stream: tuple[str, str], event_type: str, obj: dict[str, Any]) -> None:
        if self.store.apply(stream, event_type, obj):
            self._schedule()

    def _run(self, api: Any, stream: tuple[str, str]) -> None:
        def listed(items: list[dict[str, Any]]) -> None:
            self.listed(stream, items)

        def changed(event_type: str, obj: dict[str, Any]) -> None:
            self.changed(stream, event_type, obj)

        watch_forever(api, SLICES, stream[1], self._stop, listed, changed, self.watch_timeout_seconds)

    def _schedule(self) -> None:
        if self._loop is None:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the gateway is stopping
            self._loop.call_soon_threadsafe(self._publish)

    def _publish(self) -> None:
        with self._lock:
            self._pending = False
        if self._on_services is not None:
            self._on_services(self.services())

    def services(self) -> Services:
        """The AIModels' pods, from the slices the control plane keeps for their Services only."""
        return self.store.services()


@functools.lru_cache(maxsize=4096)
def _service_key(base_url: str) -> ServiceKey | None:
    return service_of(base_url)


class Lease:
    """One attempt on one target (a pod, or the Service URL): counted in flight until released."""

    def __init__(self, router: EndpointRouter, backend: Backend, endpoint: Endpoint | None) -> None:
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


class EndpointRouter:
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
