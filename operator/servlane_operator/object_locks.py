"""One writer at a time per object: every path that applies an AIModel's Deployment (its change handler,
the resync, the autoscaler, a fixed-GPU-budget move) or runs an AIFeature's rollout pass holds the
object's lock, and reads what it applies (the pin, the decision, the feature's status) once it holds it.

kopf serialises one object's own events, but the periodic loops and a feature's budget moves act on the
same AIModel from other tasks. Without this, a pass that read the pin before an await (a metrics scrape,
an API read) applied it after a newer pass had applied the next one: seen in CI, a canary pinned to 2
at 100 % went back to 1 for one pass.

Locks are taken before a lane slot (lanes.py), never while holding one, so no slot waits for a lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class ObjectLocks:
    """An asyncio.Lock per key, made on first use and dropped once nobody holds or waits for it (a
    thousand models deleted leave nothing behind)."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
