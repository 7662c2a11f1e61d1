"""Where the route table comes from: parsing API objects, and the routes file reloaded when it changes.

A routes file holds AIFeature and AIModel objects exactly as the API server would (status included):
a YAML stream of documents, a list, or a `kind: List` with `items` (what `kubectl get -o yaml` prints).
"""

from __future__ import annotations

import asyncio
import json
import logging
import marshal
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


# Objects parsed before, by kind, namespace and name: the raw object's exact form and what it parsed to.
Parsed = dict[tuple[object, object, object], tuple[bytes, AIFeature | AIModel]]
# marshal's format 2 has no back-references, so the same value always gives the same bytes; and unlike ==,
# it tells 1, 1.0 and true apart, which a manifest's validation does too.
_EXACT_FORM = 2


def parse_objects_reusing(
    raw: Iterable[dict[str, Any]], known: Parsed
) -> tuple[list[AIFeature], list[AIModel], Parsed]:
    """What parse_objects gives, parsing only the objects that are not exactly as in `known` (an earlier
    call's result): the validation is most of a reload's work, and a reload mostly changes one or two objects.
    Also returns this call's parsed objects, for the next call. An invalid object is parsed (and logged) again
    each time."""
    typed: list[AIFeature | AIModel | None] = []
    parsed: Parsed = {}
    for obj in raw:
        meta = obj.get("metadata")
        key = (obj.get("kind"), *((meta.get("namespace"), meta.get("name")) if isinstance(meta, dict) else (0, 0)))
        try:
            form: bytes | None = marshal.dumps(obj, _EXACT_FORM)
        except ValueError:  # a value YAML made that marshal cannot write (a date): parsed every time
            form = None
        before = known.get(key)
        one = before[1] if before is not None and before[0] == form else parse_object(obj)
        if one is not None and form is not None:
            parsed[key] = (form, one)
        typed.append(one)
    return (*split_kinds(typed), parsed)


def read_objects(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    documents: list[Any] = [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))
    return flatten_documents(documents)


def load_objects(path: Path) -> tuple[list[AIFeature], list[AIModel]]:
    return parse_objects(read_objects(path))


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
        self._parsed: Parsed = {}  # of the last read: what the next read need not parse again

    def latest_objects(self) -> tuple[list[AIFeature], list[AIModel]]:
        return self.latest

    def _read(self) -> tuple[list[AIFeature], list[AIModel], RouteTable]:
        features, models, self._parsed = parse_objects_reusing(read_objects(self.path), self._parsed)
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
