"""The in-cluster route source: watches AIFeature and AIModel objects and rebuilds the table on change.

Uses the official `kubernetes` client, one daemon thread per (plural, namespace) stream. Why not
kubernetes_asyncio: the official client is already the project's client (operator and serve extras),
watch traffic is a handful of small objects, and a blocking thread per stream keeps the request path
free of it; each event is applied under a lock and one rebuild is scheduled on the event loop with
call_soon_threadsafe, so a change reaches routing within milliseconds of the API server sending it.
The table is published only once every stream has listed, so routing never sees half the objects.
The list-then-watch loop (watch_forever) also serves the EndpointSlice watch (servlane_gateway.endpoints).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servlane_api import GROUP, VERSION, AIFeature, AIModel
from servlane_core.routing.routes import RouteTable, build_route_table
from servlane_gateway.sources import OnTable, parse_objects

log = logging.getLogger(__name__)

PLURALS = ("aifeatures", "aimodels")
StreamKey = tuple[str, str]  # (plural, namespace or "" for all namespaces)


class ObjectStore:
    """Raw objects per stream; pure and thread-safe, so the event handling is unit-testable."""

    def __init__(self, streams: Sequence[StreamKey]) -> None:
        self._objects: dict[StreamKey, dict[tuple[str, str], dict[str, Any]]] = {s: {} for s in streams}
        self._synced: set[StreamKey] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (str(meta.get("namespace", "default")), str(meta.get("name", "")))

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

    def table(self) -> RouteTable:
        return build_route_table(*parse_objects(self.objects()))


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


class KubeRouteSource:
    def __init__(self, namespaces: Sequence[str] = (), watch_timeout_seconds: int = 240) -> None:
        self.streams: list[StreamKey] = [(p, ns) for p in PLURALS for ns in (namespaces or [""])]
        self.store = ObjectStore(self.streams)
        self.watch_timeout_seconds = watch_timeout_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_table: OnTable | None = None
        self._publish_pending = False
        self._publish_lock = threading.Lock()
        # The objects of the table last published, status included (the console shows them).
        self.latest: tuple[list[AIFeature], list[AIModel]] = ([], [])

    def latest_objects(self) -> tuple[list[AIFeature], list[AIModel]]:
        return self.latest

    async def start(self, on_table: OnTable) -> None:
        api = custom_objects_api()
        self._loop = asyncio.get_running_loop()
        self._on_table = on_table
        for stream in self.streams:
            thread = threading.Thread(target=self._run, args=(api, stream), name=f"watch-{stream[0]}", daemon=True)
            thread.start()
            self._threads.append(thread)

    async def stop(self) -> None:
        self._stop.set()  # the threads end at their next event or watch timeout; they are daemons

    def _schedule_publish(self) -> None:
        """Coalesce a burst of events into one rebuild on the event loop."""
        if not self.store.synced or self._loop is None:
            return
        with self._publish_lock:
            if self._publish_pending:
                return
            self._publish_pending = True
        self._loop.call_soon_threadsafe(self._publish)

    def _publish(self) -> None:
        with self._publish_lock:
            self._publish_pending = False
        if self._on_table is not None:
            features, models = parse_objects(self.store.objects())
            self._on_table(build_route_table(features, models))
            self.latest = (features, models)

    def _run(self, api: Any, stream: StreamKey) -> None:
        plural, namespace = stream

        def listed(items: list[dict[str, Any]]) -> None:
            self.store.replace(stream, [_with_kind(o, plural) for o in items])
            self._schedule_publish()

        def changed(event_type: str, obj: dict[str, Any]) -> None:
            if self.store.apply(stream, event_type, _with_kind(obj, plural)):
                self._schedule_publish()

        resource = Resource(GROUP, VERSION, plural)
        watch_forever(api, resource, namespace, self._stop, listed, changed, self.watch_timeout_seconds)


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
