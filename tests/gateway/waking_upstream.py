"""A real upstream whose model is not ready until the test says so: `/ready` answers 503, then 200.

It is the test upstream of gateway_upstream.py (answers with its name, streams, records bodies) with the
runtime's `/ready` added, and the time each OpenAI request arrived (perf_counter, the test's own clock:
the server runs in the test's process) so a test can measure how soon a held request got there.
"""

from __future__ import annotations

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

    @property
    def url(self) -> str:
        return self.served.url

    def become_ready(self) -> float:
        self.ready_since = time.perf_counter()
        return self.ready_since

    def close(self) -> None:
        self.served.__exit__()


def start_waking_upstream(name: str) -> WakingUpstream:
    app, state = create_upstream(name)
    upstream = WakingUpstream(name, state, ServedApp(app))

    @app.get("/ready")
    async def ready() -> Response:
        upstream.probes += 1
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
