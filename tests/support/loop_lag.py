"""A probe of an asyncio event loop's stalls, for tests that something heavy runs off the loop."""

from __future__ import annotations

import asyncio
import time


class LoopLag:
    """How late the event loop runs a short timer, tick after tick: the loop's stalls while it runs."""

    def __init__(self, tick: float = 0.002) -> None:
        self.tick = tick
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.tick)
            self.lags.append(time.perf_counter() - started - self.tick)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
