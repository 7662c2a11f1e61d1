"""The loop every gateway replica runs: validate new batches, claim requests, send them at low priority
with at most `concurrency` in flight per feature, record each result once, finalize finished batches.

The database is the only coordination: claims are leases (store.BatchStore), renewed while a request is in
flight, so a replica that dies or is killed hands its work over once its leases run out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import suppress
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError

from servlane_core.protocol.errors import OpenAIError
from servlane_core.routing.routes import Route
from servlane_gateway.access import route_for
from servlane_gateway.batch import metrics as m
from servlane_gateway.batch import rules
from servlane_gateway.batch.files import FileGone, new_id
from servlane_gateway.batch.metrics import BatchMetrics
from servlane_gateway.batch.sender import send
from servlane_gateway.batch.store import Active, BatchStore, Claimed
from servlane_gateway.state import GatewayState

log = logging.getLogger(__name__)
MAX_BACKOFF = 30.0


class BatchWorker:
    def __init__(
        self,
        store: BatchStore,
        state: GatewayState,
        metrics: BatchMetrics,
        concurrency: int,
        lease: float,
        poll: float,
    ) -> None:
        self.store = store
        self.state = state
        self.metrics = metrics
        self.concurrency = concurrency
        self.lease = lease
        self.poll = poll
        self.me = new_id("worker-")
        self.wake = asyncio.Event()
        self.held: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.slots: dict[tuple[str, str], asyncio.Semaphore] = {}
        self.stopping: set[str] = set()  # batches being cancelled: claimed requests are given back unsent
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._renew())]

    async def stop(self) -> None:
        unanswered = list(self.held)  # taken first: a cancelled send takes itself out of `held`
        tasks = [*self._tasks, *self.held.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
        # What was claimed but not answered goes straight back to the queue (a kill leaves it to the lease).
        for batch_id, line in unanswered:
            with suppress(Exception):
                await asyncio.to_thread(self.store.retry_later, batch_id, line, self.me, time.time())

    async def _run(self) -> None:
        failures = 0
        while True:
            self.wake.clear()
            try:
                busy = await self.step()
                failures = 0
            except Exception as exc:  # the database, mostly: keep going, more slowly, without a log flood
                failures += 1
                if failures == 1:
                    log.exception("the batch worker failed a step; retrying with backoff")
                else:
                    log.warning("the batch worker failed %d steps in a row: %s", failures, type(exc).__name__)
                await asyncio.sleep(min(MAX_BACKOFF, self.poll * 2**failures))
                continue
            if not busy:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.poll)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            with suppress(Exception):
                await asyncio.to_thread(self.store.renew, self.me, list(self.held), time.time(), self.lease)

    async def step(self) -> bool:
        """One round; True when it did something (so the next round starts at once)."""
        if self.state.keys.broken:  # no owner authenticates until the keys file parses again: wait
            return False
        busy = await self._validate_one()
        active = await asyncio.to_thread(self.store.active_batches)
        self.stopping = {b.id for b in active if b.status == rules.CANCELLING}
        now = time.time()
        sending = [b for b in active if b.status == rules.IN_PROGRESS and now < b.expires_at]
        room = 2 * self.concurrency * max(1, len(self.slots)) - len(self.held)
        claimed_for: set[str] = set()
        if room > 0 and sending:
            # Fair across owners: the free places go first to the owners with the fewest in flight; what an
            # owner cannot use (nothing left to claim) goes to anyone, oldest batch first.
            owner_of = {b.id: b.owner for b in active}
            in_flight = Counter(owner_of.get(batch_id, "") for batch_id, _ in self.held)
            shares = rules.fair_shares(room, in_flight, (b.owner for b in sending))
            for batch in sending:
                got = await self._claim(batch, min(shares[batch.owner], room), now)
                shares[batch.owner] -= got
                room -= got
                if got:
                    claimed_for.add(batch.id)
            for batch in sending:
                if room <= 0:
                    break
                got = await self._claim(batch, room, now)
                room -= got
                if got:
                    claimed_for.add(batch.id)
        busy = busy or bool(claimed_for)
        for batch in active:
            mine = any(batch_id == batch.id for batch_id, _ in self.held)
            if batch.id in claimed_for:
                continue
            if not mine:
                final = await asyncio.to_thread(self.store.try_finalize, batch.id, time.time())
                if final is not None:
                    self.metrics.batches.labels(final).inc()
                    log.info("batch %s is %s", batch.id, final)
                    busy = True
        return busy

    async def _claim(self, batch: Active, limit: int, now: float) -> int:
        """Claims up to `limit` of the batch's requests and starts sending them; how many it claimed."""
        if limit <= 0:
            return 0
        claimed = await asyncio.to_thread(self.store.claim_requests, batch.id, self.me, now, self.lease, limit)
        for request in claimed:
            self.held[(batch.id, request.line)] = asyncio.create_task(self._send(batch, request))
        return len(claimed)

    async def _validate_one(self) -> bool:
        if self.state.table is None:  # the models are not known yet: every line would look uncallable
            return False
        claimed = await asyncio.to_thread(self.store.claim_validation, self.me, time.time(), self.lease)
        if claimed is None:
            return False
        owner, batch_id = claimed["owner"], claimed["id"]
        content = self.store.file_chunks(owner, claimed["input_file_id"])  # read as validation goes
        try:
            if await asyncio.to_thread(self.store.get_file, owner, claimed["input_file_id"]) is None:
                raise FileGone(claimed["input_file_id"])  # deleted before validation began
            # In a thread: a large file must not hold up the event loop that serves interactive requests.
            validated = await asyncio.to_thread(
                rules.validate, content, claimed["endpoint"], lambda model: self._callable(owner, model),
                self.state.limits,
            )  # fmt: skip
            status = await asyncio.to_thread(
                self.store.finish_validation, batch_id, self.me, validated, int(time.time())
            )
        except FileGone:
            validated = rules.Validated(fatal=rules.input_deleted())
            status = await asyncio.to_thread(
                self.store.finish_validation, batch_id, self.me, validated, int(time.time())
            )
        except (DataError, IntegrityError, ValueError, RecursionError, MemoryError) as exc:
            # This batch's own fault (its content, not the database being away): it fails alone, now, rather
            # than stopping this step for every other batch and coming back after each lease.
            log.exception("batch %s could not be validated; it fails", batch_id)
            validated = rules.Validated(fatal=rules.unvalidatable(type(exc).__name__))
            status = await asyncio.to_thread(
                self.store.finish_validation, batch_id, self.me, validated, int(time.time())
            )
        if status is not None:
            self.metrics.batches.labels(status).inc()
            self.metrics.invalid_lines.inc(len(validated.errors))
        return True

    def _route(self, owner: str, model: str) -> Route | None:
        """Where a request of `owner` for `model` goes now (None: refused), resolved as its own requests are:
        a scoped key's plain names in its own namespaces."""
        table = self.state.table
        if table is None:
            return None
        key = next((k for k in self.state.keys.keys if k.name == owner), None)
        if self.state.keys.enabled and key is None:
            return None
        try:
            return route_for(key, table, model)
        except OpenAIError:
            return None

    def _callable(self, owner: str, model: str) -> bool:
        """Whether a request of `owner` for `model` would be routed (the answer a request gets, decided now)."""
        return self._route(owner, model) is not None

    def _feature(self, owner: str, model: str) -> tuple[str, str]:
        """The feature whose concurrency slot a line takes: the one the owner's request reaches, so two
        teams' same plain name never share a slot."""
        route = self._route(owner, model)
        return (route.namespace, route.name) if route is not None else ("", "")

    async def _send(self, batch: Active, request: Claimed) -> None:
        namespace, feature = self._feature(batch.owner, str(request.body.get("model")))
        slot = self.slots.setdefault((namespace, feature), asyncio.Semaphore(self.concurrency))
        try:
            async with slot:
                if batch.id in self.stopping:
                    await asyncio.to_thread(self.store.retry_later, batch.id, request.line, self.me, time.time())
                    return
                if self.state.keys.broken:
                    # The keys file does not parse: no owner authenticates. The line waits for a fixed file
                    # rather than fail (a typo must not cost a batch its lines).
                    not_before = time.time() + self.poll
                    await asyncio.to_thread(self.store.retry_later, batch.id, request.line, self.me, not_before)
                    return
                request_id = new_id("batch_req_")
                gauge = self.metrics.in_flight.labels(namespace, feature)
                gauge.inc()
                try:
                    answer = await send(self.state, batch.owner, batch.endpoint.removeprefix("/v1/"), request.body,
                                        request_id)  # fmt: skip
                finally:
                    gauge.dec()
            await self._settle(batch, request, namespace, feature, answer.status, answer.body, request_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s line %d failed in the gateway; it will be retried", batch.id, request.line)
        finally:
            self.held.pop((batch.id, request.line), None)
            self.wake.set()

    async def _settle(
        self, batch: Active, request: Claimed, namespace: str, feature: str, status: int, body: Any, request_id: str
    ) -> None:
        if rules.should_retry(status, request.attempts) and time.time() < batch.expires_at:
            wait = _retry_after(body) or min(MAX_BACKOFF, 0.5 * 2**request.attempts)
            await asyncio.to_thread(self.store.retry_later, batch.id, request.line, self.me, time.time() + wait)
            self.metrics.requests.labels(namespace, feature, m.RETRIED).inc()
            return
        ok = 200 <= status < 300
        line = rules.response_line(request_id, request.custom_id, status, request_id, body)
        written = await asyncio.to_thread(self.store.record, batch.id, request.line, line, ok, time.time())
        outcome = (m.SUCCEEDED if ok else m.FAILED) if written else m.DUPLICATE
        self.metrics.requests.labels(namespace, feature, outcome).inc()


def _retry_after(body: Any) -> float | None:
    error = body.get("error") if isinstance(body, dict) else None
    value = error.get("retry_after") if isinstance(error, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None
