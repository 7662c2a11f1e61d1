"""How many AIModel reconciles run at once, and which go first.

kopf runs one worker per object, so a thousand AIModels applied at once (or an operator restart) start a
thousand reconciles together. Unbounded, each holds its parsed model and built children while it waits
for a worker thread, and the API server, flooded, throttles everyone alike: a team's one edit then waits
behind the whole burst. Here a fixed number of reconciles hold a slot; the others wait, ordered by
priority and first come first served within one, holding only what kopf already holds for them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import IntEnum


class Priority(IntEnum):
    """Lower goes first."""

    CHANGE = 0  # a spec edit, or a canary's replica budget moving: someone is waiting for it now
    CREATE = 1  # a new AIModel: its children must exist before anything else can happen to it
    STATUS = 2  # status following the children (pods starting, becoming Ready, failing)
    RESUME = 3  # every AIModel again after an operator restart
    RESYNC = 4  # the periodic re-apply that puts hand edits back


class Lanes:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self._free = slots
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, future in self._waiters if not future.done())

    @property
    def busy(self) -> int:
        return self.slots - self._free

    @asynccontextmanager
    async def slot(self, priority: Priority) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, priority: Priority) -> None:
        """Waits for a slot; every acquire that returns must be followed by exactly one release()."""
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (int(priority), next(self._seq), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a slot at the moment it was cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():  # a cancelled waiter's future is done: skip it
                future.set_result(None)  # the slot passes straight to the next waiter
                return
        self._free += 1
