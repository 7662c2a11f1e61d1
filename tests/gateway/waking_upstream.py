"""A real upstream whose model is not ready until the test says so: `/ready` answers 503, then 200.

It is the test upstream of gateway_upstream.py (answers with its name, streams, records bodies) with the
runtime's `/ready` added (with `waits`, as the runtime takes `/ready?wait=`: answered when ready, or at the
end of the wait; without, answered at once, as an older runtime or another server does), and the time each
OpenAI request arrived (perf_counter, the test's own clock: the server runs in the test's process) so a test
can measure how soon a held request got there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from tests.support.gateway_harness import ServedApp
from tests.support.gateway_upstream import UpstreamState, create_upstream


@dataclass
class WakingUpstream:
    name: str
    state: UpstreamState
    served: ServedApp
    ready_since: float | None = None  # perf_counter when /ready started answering 200
    arrivals: list[float] = field(default_factory=list)  # perf_counter of each OpenAI request's arrival
    probes: int = 0  # /ready asked
    waits: bool = False  # takes /ready?wait=
    waiting: int = 0  # /ready?wait= asks open now
    _loop: asyncio.AbstractEventLoop | None = None
    _ready: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return self.served.url

    def become_ready(self) -> float:
        self.ready_since = time.perf_counter()
        if self._loop is not None and self._ready is not None:  # from the test's thread to the server's loop
            self._loop.call_soon_threadsafe(self._ready.set)
        return self.ready_since

    def close(self) -> None:
        self.served.__exit__()


def start_waking_upstream(name: str, waits: bool = False) -> WakingUpstream:
    app, state = create_upstream(name)
    upstream = WakingUpstream(name, state, ServedApp(app), waits=waits)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        upstream.probes += 1
        if upstream._ready is None:  # before ready_since is read: become_ready sets one, then the other
            upstream._loop, upstream._ready = asyncio.get_running_loop(), asyncio.Event()
        wait = float(request.query_params.get("wait") or 0) if upstream.waits else 0.0
        if upstream.ready_since is None and wait > 0:
            upstream.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(upstream._ready.wait(), wait)
            finally:
                upstream.waiting -= 1
        if upstream.ready_since is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.middleware("http")
    async def arrivals(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method == "POST":
            upstream.arrivals.append(time.perf_counter())
        return await call_next(request)

    upstream.served.__enter__()
    return upstream
