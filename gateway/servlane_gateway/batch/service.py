"""The Batch API wired into a gateway app: its routes always (they say when no database is configured),
and with a database, the migrations and the worker for the app's lifetime.

The database is brought up in the background: a gateway whose batch database does not answer still
starts and serves interactive traffic; the Batch API answers 503 with Retry-After until the schema is
migrated, retried with backoff meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

from fastapi import FastAPI

from servlane_gateway.batch.files import redacted
from servlane_gateway.batch.metrics import BatchMetrics
from servlane_gateway.batch.routes import UPLOADS_AT_ONCE, UPLOADS_AT_ONCE_PER_KEY, batch_router
from servlane_gateway.batch.store import BatchStore
from servlane_gateway.batch.worker import BatchWorker
from servlane_gateway.state import GatewayState

log = logging.getLogger(__name__)
FIRST_TRY_SECONDS = 15.0  # the most the gateway's start waits for its first try
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


class BatchService:
    def __init__(
        self,
        state: GatewayState,
        database_url: str | None,
        concurrency: int,
        lease: float,
        poll: float,
        max_file_bytes: int,
        max_owner_bytes: int | None = None,
        allow_without_keys: bool = False,
        uploads_at_once: tuple[int, int] = (UPLOADS_AT_ONCE, UPLOADS_AT_ONCE_PER_KEY),  # per replica, per key
    ) -> None:
        self.database_url = database_url
        self.store = BatchStore(database_url, max_owner_bytes) if database_url else None
        self.open_to_everyone = allow_without_keys and not state.keys.enabled
        self.metrics = BatchMetrics(state.metrics.registry)
        self.worker = (
            BatchWorker(self.store, state, self.metrics, concurrency, lease, poll) if self.store is not None else None
        )
        self.ready = False
        self.router = batch_router(
            state, self.store, max_file_bytes, self._wake, lambda: self.ready, allow_without_keys, *uploads_at_once
        )
        self._bring_up: asyncio.Task[None] | None = None
        self._first_try = asyncio.Event()

    def _wake(self) -> None:
        if self.worker is not None:
            self.worker.wake.set()

    def install(self, app: FastAPI) -> None:
        app.include_router(self.router)

    async def start(self) -> None:
        if self.store is None:
            log.info("the Batch API is off (no --batch-database-url): /v1/files and /v1/batches say so")
            return
        if self.open_to_everyone:
            log.warning(
                "the Batch API runs without API keys (--batch-allow-without-keys): every caller is the same "
                "owner and can read every batch's files and results; fine for one user, never for tenants"
            )
        self._bring_up = asyncio.create_task(self._up())
        # A database that answers is ready before the first request; one that does not delays nothing.
        with suppress(TimeoutError):
            await asyncio.wait_for(self._first_try.wait(), FIRST_TRY_SECONDS)

    async def _up(self) -> None:
        assert self.store is not None
        assert self.worker is not None
        assert self.database_url is not None
        wait = FIRST_RETRY_SECONDS
        while True:
            try:
                await asyncio.to_thread(self.store.migrate)
                break
            except Exception as exc:
                self._first_try.set()
                log.error(
                    "the Batch API's database %s is not usable (%s); retrying in %gs",
                    redacted(self.database_url), type(exc).__name__, wait,
                )  # fmt: skip
                await asyncio.sleep(wait)
                wait = min(MAX_RETRY_SECONDS, wait * 2)
        log.info("the Batch API keeps its state in %s", redacted(self.database_url))
        await self.worker.start()
        self.ready = True
        self._first_try.set()

    async def latest(self, owner: str | None, limit: int = 20) -> list[dict[str, Any]] | None:
        """The newest batches of `owner` (None: everyone's) for the console; None while the Batch API is off
        or its database is not usable (the console says so rather than failing)."""
        if self.store is None or not self.ready:
            return None
        try:
            return await asyncio.to_thread(self.store.latest_batches, owner, limit)
        except Exception as exc:
            log.warning("the console could not read the batches: %s", type(exc).__name__)
            return None

    async def stop(self) -> None:
        if self._bring_up is not None:
            self._bring_up.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._bring_up
        if self.worker is not None and self.ready:
            await self.worker.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
