"""The EndpointSlice watch that tells the pod router (routing.pods) which pods each AIModel's Service has.

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
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from servlane_api.children import child_name
from servlane_core.routing.endpoint_pick import (
    Endpoint,
)
from servlane_gateway.routing.kube_watch import Resource, custom_objects_api, watch_forever

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MODEL_LABEL = "servlane.dev/model"  # on the operator's Services, hence on their slices
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"  # the control plane's, for Services with a selector
SLICE_SELECTOR = f"{SERVICE_NAME_LABEL},{MODEL_LABEL},{MANAGED_BY_LABEL}={SLICE_CONTROLLER}"
SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", SLICE_SELECTOR)
PORT_NAME = "http"  # the operator's Service port
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
