"""Admission control: at most `max_in_flight` requests run, at most `max_queue` wait, none forever.

Waiters are served by priority (`X-Priority: high|normal|low`), first come first served within a
priority. A full queue answers 429; a wait past the deadline answers 503; both carry Retry-After.
Everything is asyncio on the event loop: waiting never blocks it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from servlane_core.protocol.errors import OpenAIError, overloaded

Priority = Literal["high", "normal", "low"]
_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}


def parse_priority(header: str | None) -> Priority:
    value = (header or "normal").strip().lower()
    if value not in _RANK:
        raise OpenAIError(400, "X-Priority must be one of high, normal, low", param="X-Priority")
    return value  # type: ignore[return-value]  # checked against _RANK just above


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class AdmissionGrant:
    """One admitted request; `release` is idempotent so every exit path may call it."""

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._controller._release()


class AdmissionController:
    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout: float) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._in_flight = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queue_depth(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    async def acquire(self, priority: Priority = "normal") -> AdmissionGrant:
        if self._in_flight < self.max_in_flight and self.queue_depth == 0:
            self._in_flight += 1
            return AdmissionGrant(self)
        if self.queue_depth >= self.max_queue:
            raise overloaded(429, "The server is at capacity and its queue is full; retry later.", 1)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, _Waiter(_RANK[priority], next(self._seq), future))
        try:
            done, _ = await asyncio.wait({future}, timeout=self.queue_timeout)
        except asyncio.CancelledError:
            self._abandon(future)
            raise
        if not done:
            self._abandon(future)
            message = f"The request waited {self.queue_timeout:g}s in the queue without a free slot; retry later."
            raise overloaded(503, message, self.queue_timeout)
        # _release handed its slot over to us (in_flight already counts this request).
        return AdmissionGrant(self)

    @asynccontextmanager
    async def slot(self, priority: Priority = "normal") -> AsyncIterator[AdmissionGrant]:
        held = await self.acquire(priority)
        try:
            yield held
        finally:
            held.release()

    def _abandon(self, future: asyncio.Future[None]) -> None:
        if future.done() and not future.cancelled():
            self._release()  # granted at the very moment we gave up: pass the slot on
        else:
            future.cancel()
        self._waiters = [w for w in self._waiters if not w.future.done()]
        heapq.heapify(self._waiters)

    def _release(self) -> None:
        while self._waiters:
            waiter = heapq.heappop(self._waiters)
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes straight to the next waiter
                return
        self._in_flight -= 1
