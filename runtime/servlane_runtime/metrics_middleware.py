"""Counts every OpenAI request of the runtime's API port by endpoint and final status (an ASGI middleware)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servlane_runtime.runtime_metrics import OPENAI_PATHS, RuntimeMetrics


class MetricsMiddleware:
    """Counts every OpenAI request by endpoint and final status, and times it to the last byte."""

    def __init__(self, app: ASGIApp, metrics: RuntimeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in OPENAI_PATHS:
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 500  # an exception before the response started

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.monotonic() - start)
