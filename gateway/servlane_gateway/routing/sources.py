"""Where the route table comes from: parsing API objects, and the routes file reloaded when it changes.

A routes file holds AIFeature and AIModel objects exactly as the API server would (status included):
a YAML stream of documents, a list, or a `kind: List` with `items` (what `kubectl get -o yaml` prints).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import yaml

from servlane_api import AIFeature, AIModel
from servlane_api.manifests import InvalidManifest, parse_resource
from servlane_core.routing.routes import RouteTable, build_route_table

log = logging.getLogger(__name__)

OnTable = Callable[[RouteTable], None]


class RouteSource(Protocol):
    async def start(self, on_table: OnTable) -> None:
        """Deliver the first table (or fail), then keep delivering changes in the background."""

    async def stop(self) -> None: ...


def flatten_documents(documents: Iterable[Any]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for doc in documents:
        if isinstance(doc, list):
            objects.extend(flatten_documents(doc))
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            objects.extend(flatten_documents(doc["items"]))
        elif isinstance(doc, dict):
            objects.append(doc)
    return objects


def parse_object(obj: dict[str, Any]) -> AIFeature | AIModel | None:
    """The typed object of a raw one; None for another kind, or an invalid object (logged, never fatal)."""
    try:
        return parse_resource(obj)
    except InvalidManifest as exc:
        log.warning("ignoring %s", exc)
    return None


def split_kinds(typed: Iterable[AIFeature | AIModel | None]) -> tuple[list[AIFeature], list[AIModel]]:
    """The features and the AIModels among typed objects, in their order (None: left out)."""
    features: list[AIFeature] = []
    models: list[AIModel] = []
    for obj in typed:
        if isinstance(obj, AIFeature):
            features.append(obj)
        elif isinstance(obj, AIModel):
            models.append(obj)
    return features, models


def parse_objects(raw: Iterable[dict[str, Any]]) -> tuple[list[AIFeature], list[AIModel]]:
    """Typed objects from raw ones; an invalid object is logged and left out, never fatal."""
    return split_kinds([parse_object(obj) for obj in raw])


def load_objects(path: Path) -> tuple[list[AIFeature], list[AIModel]]:
    text = path.read_text()
    documents: list[Any] = [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))
    return parse_objects(flatten_documents(documents))


def load_routes_file(path: Path) -> RouteTable:
    return build_route_table(*load_objects(path))


def file_signature(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is replaced or rewritten (inode for ConfigMap-style symlink swaps)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class FileRouteSource:
    """Reads the file, then polls its signature (a stat per interval: cheap) and reloads on change.
    A file that fails to parse keeps the previous table. Reading, validating and building run on a thread,
    not on the event loop: at 1,000 features and 1,000 AIModels they take a few hundred milliseconds, which
    on the loop would stall every request (bench/route_rebuild_bench.py)."""

    def __init__(self, path: Path, poll_seconds: float = 0.2) -> None:
        self.path = path
        self.poll_seconds = poll_seconds
        self._task: asyncio.Task[None] | None = None
        # The objects of the table last delivered, status included (the console shows them).
        self.latest: tuple[list[AIFeature], list[AIModel]] = ([], [])

    def latest_objects(self) -> tuple[list[AIFeature], list[AIModel]]:
        return self.latest

    def _read(self) -> tuple[list[AIFeature], list[AIModel], RouteTable]:
        features, models = load_objects(self.path)
        return features, models, build_route_table(features, models)

    async def _load(self, on_table: OnTable) -> None:
        features, models, table = await asyncio.to_thread(self._read)
        on_table(table)
        self.latest = (features, models)

    async def start(self, on_table: OnTable) -> None:
        signature = file_signature(self.path)
        await self._load(on_table)
        self._task = asyncio.create_task(self._watch(on_table, signature))

    async def _watch(self, on_table: OnTable, signature: tuple[int, int, int] | None) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            current = file_signature(self.path)
            if current == signature or current is None:
                continue
            signature = current
            try:
                await self._load(on_table)
                log.info("reloaded routes from %s", self.path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.error("keeping the previous routes: %s does not load: %s", self.path, exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
