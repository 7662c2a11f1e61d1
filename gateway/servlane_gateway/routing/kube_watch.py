"""The in-cluster route source: watches AIFeature and AIModel objects and rebuilds the table on change.

Uses the official `kubernetes` client, one daemon thread per (plural, namespace) stream. Why not
kubernetes_asyncio: the official client is already the project's client (operator and serve extras),
watch traffic is a handful of small objects, and a blocking thread per stream keeps the request path
free of it. Each event is parsed on its watch thread, once, and kept (RouteObjectStore); it asks for a
rebuild only when it changes what routing reads (routing_view): a tenant annotating or relabelling its
own objects, or the operator writing status fields routing ignores, rebuilds nothing.
The table is built on a thread of its own (TableBuilder), never on the event loop: at 1,000 features
and 1,000 AIModels a build takes a few hundred milliseconds, which on the loop would stall every
tenant's requests. Builds are coalesced: at most one runs and one waits, however many events come.
The table is published only once every stream has listed, so routing never sees half the objects.
Backends are each AIModel's own Service, named from its name and namespace (servlane_api.children), never
status.endpoint: status is writable by whoever may patch `aimodels/status`.
The list-then-watch loop (watch_forever) also serves the EndpointSlice watch (servlane_gateway.routing.slices).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servlane_api import GROUP, VERSION, AIFeature, AIModel
from servlane_api.children import DEFAULT_CLUSTER_DOMAIN
from servlane_core.routing.routes import WAKING_PHASES, RouteTable, build_route_table
from servlane_gateway.routing.sources import OnTable, parse_object, split_kinds

log = logging.getLogger(__name__)

PLURALS = ("aifeatures", "aimodels")
StreamKey = tuple[str, str]  # (plural, namespace or "" for all namespaces)


def object_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "default")), str(meta.get("name", "")))


class ObjectStore:
    """Raw objects per stream; pure and thread-safe, so the event handling is unit-testable."""

    def __init__(self, streams: Sequence[StreamKey]) -> None:
        self._objects: dict[StreamKey, dict[tuple[str, str], dict[str, Any]]] = {s: {} for s in streams}
        self._synced: set[StreamKey] = set()
        self._lock = threading.Lock()

    _key = staticmethod(object_key)

    def replace(self, stream: StreamKey, items: list[dict[str, Any]]) -> None:
        """A fresh list of the stream (first sync, or a relist after the watch expired)."""
        with self._lock:
            self._objects[stream] = {self._key(o): o for o in items}
            self._synced.add(stream)

    def apply(self, stream: StreamKey, event_type: str, obj: dict[str, Any]) -> bool:
        """One watch event; True when it changed the objects."""
        with self._lock:
            objects = self._objects[stream]
            if event_type in ("ADDED", "MODIFIED"):
                objects[self._key(obj)] = obj
                return True
            if event_type == "DELETED":
                return objects.pop(self._key(obj), None) is not None
            return False  # BOOKMARK and the like

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced == set(self._objects)

    def objects(self) -> list[dict[str, Any]]:
        with self._lock:
            return [o for objects in self._objects.values() for o in objects.values()]


# What routes.py reads of an object's status; with the spec, the name and the namespace, all it reads.
ROUTING_STATUS = {"AIModel": ("endpoint", "servedModelName"), "AIFeature": ("weights",)}
READY = "Ready"


def routing_view(obj: dict[str, Any], valid: bool = True) -> tuple[Any, ...]:
    """What the route table reads of an object (servlane_core.routing.routes): its kind, namespace and
    name, whether it is valid, its spec, and the status fields routing reads (an AIModel's endpoint,
    served name and Ready condition, and while it is not ready whether its phase wakes it (routes.can_wake:
    requests then wait for it); a feature's weights). Two versions of an object with the same view build the
    same routes, so a change of anything else (annotations, labels, managedFields, resourceVersion, the
    phase of a ready model, replica counts) needs no rebuild. Keep it in step with routes.py."""
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    status = obj.get("status") or {}
    read = {field: status.get(field) for field in ROUTING_STATUS.get(str(kind), ())}
    if kind == "AIModel":
        conditions = status.get("conditions") or []
        read[READY] = [c.get("status") for c in conditions if isinstance(c, dict) and c.get("type") == READY]
        if read[READY] != ["True"]:
            read["wakes"] = status.get("phase") in WAKING_PHASES
    return (kind, meta.get("namespace", "default"), meta.get("name", ""), valid, obj.get("spec"), read)


Typed = AIFeature | AIModel


@dataclass(frozen=True)
class Entry:
    typed: Typed | None  # None: an invalid object (logged when it came), left out of routing
    view: tuple[Any, ...]  # routing_view of the raw object


def entry_of(obj: dict[str, Any]) -> Entry:
    typed = parse_object(obj)
    return Entry(typed, routing_view(obj, valid=typed is not None))


class RouteObjectStore:
    """The AIFeatures and AIModels per stream, each parsed once as it comes (on its watch thread), so
    neither a rebuild nor the console parses the whole set again; thread-safe. replace and apply say
    whether routing must be rebuilt: only when some object's routing_view changed."""

    def __init__(self, streams: Sequence[StreamKey]) -> None:
        self._entries: dict[StreamKey, dict[tuple[str, str], Entry]] = {s: {} for s in streams}
        self._synced: set[StreamKey] = set()
        self._lock = threading.Lock()

    def replace(self, stream: StreamKey, items: list[dict[str, Any]]) -> bool:
        """A fresh list of the stream (first sync, or a relist after the watch failed)."""
        entries = {object_key(o): entry_of(o) for o in items}
        with self._lock:
            first = stream not in self._synced
            before = {key: entry.view for key, entry in self._entries[stream].items()}
            self._entries[stream] = entries
            self._synced.add(stream)
        return first or before != {key: entry.view for key, entry in entries.items()}

    def apply(self, stream: StreamKey, event_type: str, obj: dict[str, Any]) -> bool:
        """One watch event; True when it changed what routing reads."""
        key = object_key(obj)
        if event_type in ("ADDED", "MODIFIED"):
            entry = entry_of(obj)
            with self._lock:
                known = self._entries[stream].get(key)
                self._entries[stream][key] = entry  # kept even when routing ignores the change: the console shows it
            return known is None or known.view != entry.view
        if event_type == "DELETED":
            with self._lock:
                return self._entries[stream].pop(key, None) is not None
        return False  # BOOKMARK and the like

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced == set(self._entries)

    def typed(self) -> tuple[list[AIFeature], list[AIModel]]:
        """The valid objects, as they are now (status included)."""
        with self._lock:
            found = [entry.typed for entries in self._entries.values() for entry in entries.values()]
        return split_kinds(found)

    def table(self, cluster_domain: str | None = DEFAULT_CLUSTER_DOMAIN) -> RouteTable:
        return build_route_table(*self.typed(), cluster_domain=cluster_domain)


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The gateway's own namespace: POD_NAMESPACE (downward API), else the mounted service account's,
    else the kubeconfig's current context's namespace, else `default` (kubectl's rule)."""
    if found := os.environ.get("POD_NAMESPACE", "").strip():
        return found
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        pass
    try:
        from kubernetes import config

        _, current = config.list_kube_config_contexts()
        return str((current or {}).get("context", {}).get("namespace") or "default")
    except Exception:  # no kubeconfig (yet): the watch itself will fail loudly on start
        return "default"


def custom_objects_api() -> Any:
    """The API with the in-cluster config, else the kubeconfig's."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CustomObjectsApi()


def _with_kind(obj: dict[str, Any], plural: str) -> dict[str, Any]:
    # List responses may omit each item's kind; parse_objects dispatches on it.
    return {**obj, "kind": "AIFeature" if plural == "aifeatures" else "AIModel"}


class BuildTable(Protocol):
    def __call__(
        self, features: list[AIFeature], models: list[AIModel], *, cluster_domain: str | None
    ) -> RouteTable: ...


class TableBuilder:
    """Builds the route table on a thread of its own and hands each one to the event loop. Coalesced: a
    request while a build runs marks one more build to follow it, however many requests come, so at most
    one build runs and one waits, and the last one always sees the latest objects."""

    def __init__(self, build: Callable[[], RouteTable], deliver: Callable[[RouteTable], None]) -> None:
        self._build = build
        self._deliver = deliver
        self._wanted = False
        self._stopped = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="route-table-builder", daemon=True)
        self.builds = 0  # how many tables were built (the tests read it)
        self.last_build_seconds = 0.0

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        with self._wake:
            self._wanted = True
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._wanted or self._stopped)
                if self._stopped:
                    return
                self._wanted = False  # requests from now on ask for one more build after this one
            started = time.perf_counter()
            try:
                table = self._build()
            except Exception:  # a bug in a build must not end the builder: the next change retries
                log.exception("building the route table failed; keeping the previous one")
                continue
            self.last_build_seconds = time.perf_counter() - started
            self.builds += 1
            self._deliver(table)


class KubeRouteSource:
    def __init__(
        self,
        namespaces: Sequence[str] = (),
        watch_timeout_seconds: int = 240,
        cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
        build: BuildTable = build_route_table,
    ) -> None:
        self.streams: list[StreamKey] = [(p, ns) for p in PLURALS for ns in (namespaces or [""])]
        self.store = RouteObjectStore(self.streams)
        self.watch_timeout_seconds = watch_timeout_seconds
        self.cluster_domain = cluster_domain  # backends are `model-<name>.<namespace>.svc.<cluster_domain>`
        self._build = build
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_table: OnTable | None = None
        self.builder = TableBuilder(self._build_table, self._hand_over)

    def latest_objects(self) -> tuple[list[AIFeature], list[AIModel]]:
        """The objects as watched now, status included (the console shows them)."""
        return self.store.typed()

    async def start(self, on_table: OnTable) -> None:
        api = custom_objects_api()
        self.start_building(on_table)
        for stream in self.streams:
            thread = threading.Thread(target=self._run, args=(api, stream), name=f"watch-{stream[0]}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def start_building(self, on_table: OnTable) -> None:
        """From now on, tables are built and handed to `on_table` on this (the running) event loop."""
        self._loop = asyncio.get_running_loop()
        self._on_table = on_table
        self.builder.start()

    async def stop(self) -> None:
        self._stop.set()  # the watch threads end at their next event or watch timeout; they are daemons
        self.builder.stop()

    def listed(self, stream: StreamKey, items: list[dict[str, Any]]) -> None:
        if self.store.replace(stream, [_with_kind(o, stream[0]) for o in items]):
            self._rebuild()

    def changed(self, stream: StreamKey, event_type: str, obj: dict[str, Any]) -> None:
        if self.store.apply(stream, event_type, _with_kind(obj, stream[0])):
            self._rebuild()

    def _rebuild(self) -> None:
        if self.store.synced:  # never a table of half the objects
            self.builder.request()

    def _build_table(self) -> RouteTable:
        features, models = self.store.typed()
        return self._build(features, models, cluster_domain=self.cluster_domain)

    def _hand_over(self, table: RouteTable) -> None:
        """On the builder thread: the table goes to the event loop (in build order: call_soon is FIFO)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the gateway is stopping
                loop.call_soon_threadsafe(self._publish, table)

    def _publish(self, table: RouteTable) -> None:
        if self._on_table is not None:
            self._on_table(table)

    def _run(self, api: Any, stream: StreamKey) -> None:
        def listed(items: list[dict[str, Any]]) -> None:
            self.listed(stream, items)

        def changed(event_type: str, obj: dict[str, Any]) -> None:
            self.changed(stream, event_type, obj)

        resource = Resource(GROUP, VERSION, stream[0])
        watch_forever(api, resource, stream[1], self._stop, listed, changed, self.watch_timeout_seconds)


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    label_selector: str = ""  # only the objects with these labels


def watch_forever(
    api: Any,
    resource: Resource,
    namespace: str,
    stop: threading.Event,
    listed: Callable[[list[dict[str, Any]]], None],
    changed: Callable[[str, dict[str, Any]], None],
    timeout_seconds: int,
) -> None:
    """One (resource, namespace or "" for all) stream until `stop`: list (`listed` gets the items), then
    watch from the list's resourceVersion (`changed` gets each event), relist on any error (410 Gone
    included). Through CustomObjectsApi, which builds the same paths for built-in groups (EndpointSlices)."""
    from kubernetes import watch

    what = resource.plural
    args: tuple[Any, ...] = (resource.group, resource.version)
    args += (namespace, what) if namespace else (what,)
    func = api.list_namespaced_custom_object if namespace else api.list_cluster_custom_object
    selector = {"label_selector": resource.label_selector} if resource.label_selector else {}
    resource_version = ""
    while not stop.is_set():
        try:
            if not resource_version:
                result = func(*args, **selector)
                listed(list(result.get("items", [])))
                resource_version = str(result.get("metadata", {}).get("resourceVersion", ""))
            w = watch.Watch()
            for event in w.stream(
                func, *args, resource_version=resource_version,
                timeout_seconds=timeout_seconds, allow_watch_bookmarks=True, **selector,
            ):  # fmt: skip
                if stop.is_set():
                    w.stop()
                    break
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                resource_version = str(obj.get("metadata", {}).get("resourceVersion", resource_version))
                changed(str(event.get("type")), obj)
        except Exception as exc:  # any failure: relist after a short pause (410 Gone included)
            log.warning("watch of %s in %s failed, relisting: %s", what, namespace or "all namespaces", exc)
            resource_version = ""
            stop.wait(1.0)
