"""LoRA adapters: the runtime serves what the adapters file lists, loading and unloading them live.

The operator writes the list into a ConfigMap mounted into the pod (standalone mode writes the file
itself). The kubelet replaces the file when the ConfigMap changes, so the runtime reads it again every
POLL_SECONDS and brings the engine to it: new adapters load, removed ones unload (after the requests
that use them end), a changed source reloads. No restart, and the base model keeps serving throughout.

An adapter is `loading`, `ready` or `failed` (its reason in /ready); requests for one that is not ready
get 503 with Retry-After, for one the file does not list 404, like any unknown model.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from servlane_core.protocol.errors import OpenAIError, model_not_found, overloaded
from servlane_core.redaction import redact

from .engines.base import InferenceEngine
from .model_source import resolve_model_source

log = logging.getLogger(__name__)

AdapterState = Literal["loading", "ready", "failed"]
# The kubelet takes up to its sync period to update the file; reading it is cheap.
POLL_SECONDS = 1.0
_RETRY_AFTER_LOADING = 2.0
_RETRY_AFTER_FAILED = 30.0


class AdaptersFileError(ValueError):
    """The adapters file is not a JSON list of {"name", "source"}: the runtime keeps what it serves."""


@dataclass(frozen=True)
class AdapterChanges:
    unload: tuple[str, ...]
    load: tuple[tuple[str, str], ...]


def parse_adapters(text: str) -> dict[str, str]:
    """The adapters file's content as name -> source."""
    try:
        items = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as exc:
        raise AdaptersFileError(f"not JSON: {exc}") from exc
    if not isinstance(items, list):
        raise AdaptersFileError("expected a JSON list of adapters")
    out: dict[str, str] = {}
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("source"), str)):
            raise AdaptersFileError(f"expected {{'name': ..., 'source': ...}}, got {item!r}")
        if item["name"] in out:
            raise AdaptersFileError(f"adapter {item['name']!r} is listed twice")
        out[item["name"]] = item["source"]
    return out


def plan_changes(serving: dict[str, str], wanted: dict[str, str]) -> AdapterChanges:
    """What turns the adapters being served (name -> source) into the wanted ones; a new source reloads."""
    unload = tuple(sorted(n for n, source in serving.items() if wanted.get(n) != source))
    load = tuple(sorted((n, source) for n, source in wanted.items() if serving.get(n) != source))
    return AdapterChanges(unload, load)


@dataclass
class _Adapter:
    source: str
    state: AdapterState = "loading"
    reason: str = ""


class AdapterHost:
    """Keeps the engine's adapters equal to the file's list, one change at a time."""

    def __init__(self, path: str, cache_dir: str, poll_seconds: float = POLL_SECONDS) -> None:
        self._path = Path(path)
        self._cache_dir = cache_dir
        self._poll = poll_seconds
        self._adapters: dict[str, _Adapter] = {}
        self._last_text: str | None = None

    def states(self) -> dict[str, dict[str, str]]:
        return {
            name: {"state": a.state, **({"reason": a.reason} if a.reason else {})}
            for name, a in sorted(self._adapters.items())
        }

    def ready_names(self) -> list[str]:
        return sorted(name for name, a in self._adapters.items() if a.state == "ready")

    def check(self, name: str) -> None:
        """Nothing if `name` is a ready adapter; else the error its requests get."""
        adapter = self._adapters.get(name)
        if adapter is None:
            raise model_not_found(name)
        if adapter.state == "loading":
            raise overloaded(503, f"The adapter {name!r} is loading", _RETRY_AFTER_LOADING)
        if adapter.state == "failed":
            error: OpenAIError = overloaded(
                503, f"The adapter {name!r} failed to load: {adapter.reason}", _RETRY_AFTER_FAILED
            )
            raise error

    def knows(self, name: str) -> bool:
        return name in self._adapters

    async def run(self, engine: InferenceEngine) -> None:
        """Follow the file for as long as the model serves (cancelled at shutdown)."""
        while True:
            await self.sync_once(engine)
            await asyncio.sleep(self._poll)  # a period, not a synchronisation

    async def sync_once(self, engine: InferenceEngine) -> None:
        try:
            text = await asyncio.to_thread(self._read)
        except OSError as exc:
            if self._last_text is not None:  # logged once per change, not every second
                log.warning("cannot read the adapters file %s: %s; keeping the adapters served", self._path, exc)
                self._last_text = None
            return
        if text == self._last_text:
            return
        self._last_text = text
        try:
            wanted = parse_adapters(text)
        except AdaptersFileError as exc:
            log.error("adapters file %s: %s; keeping the adapters served", self._path, exc)
            return
        changes = plan_changes({n: a.source for n, a in self._adapters.items()}, wanted)
        for name in changes.unload:
            # Forgotten first, so that new requests for it are refused while the engine lets the running ones end.
            self._adapters.pop(name, None)
            await _logged(f"unloading adapter {name}", engine.unload_adapter(name))
        for name, source in changes.load:
            self._adapters[name] = adapter = _Adapter(source)
            try:
                path = await asyncio.to_thread(resolve_model_source, source, self._cache_dir)
                await engine.load_adapter(name, path)
            except Exception as exc:  # a bad adapter fails alone; the base model and the others keep serving
                adapter.state, adapter.reason = "failed", redact(f"{type(exc).__name__}: {exc}")  # shown to callers
                log.error("adapter %s from %s failed to load: %s", name, source, adapter.reason)
                continue
            if self._adapters.get(name) is adapter:
                adapter.state = "ready"
                log.info("adapter %s ready (from %s)", name, source)

    def _read(self) -> str:
        return self._path.read_text()


async def _logged(what: str, work: Awaitable[None]) -> None:
    try:
        await work
    except Exception as exc:
        log.error("%s failed: %s", what, redact(f"{type(exc).__name__}: {exc}"))
