"""The FastAPI app: thin routes over OpenAIServing, admission around generation, probes; /metrics on its own port.

The model loads in a background task started by the lifespan, after the server is listening.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from servlane_api.runtime_config import (
    HEALTH_PATH,
    READY_MAX_WAIT_SECONDS,
    READY_PATH,
    READY_WAIT_PARAM,
    RuntimeConfig,
)
from servlane_core.protocol import openai as p
from servlane_core.protocol.errors import OpenAIError, model_not_found
from servlane_core.protocol.limits import RequestLimits
from servlane_runtime.metrics_middleware import MetricsMiddleware
from servlane_runtime.runtime_metrics import RuntimeMetrics
from servlane_web.client_watch import ClientGone, unless_client_leaves
from servlane_web.errors import install_error_handlers
from servlane_web.routes import get_and_head
from servlane_web.tracing import TracingMiddleware, spans_of, start_tracing, stop_tracing

from .admission import AdmissionController, AdmissionGrant, parse_priority
from .engines import create_engine
from .engines.base import EngineError
from .metrics_port import MetricsPort
from .model_host import EngineFactory, ModelHost
from .request_guard import RequestGuard
from .serving import OpenAIServing
from .startup import FirstRequestStamp, StartupClock


class SlotStreamingResponse(StreamingResponse):
    """SSE that gives its admission slot back however the stream ends (done, error, client gone)."""

    def __init__(self, content: AsyncIterator[str], slot: AdmissionGrant) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._slot = slot
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                await aclose()  # stops the engine if the client went away mid-stream
            self._slot.release()


def create_app(
    config: RuntimeConfig, engine_factory: EngineFactory = create_engine, startup: StartupClock | None = None
) -> FastAPI:
    host = ModelHost(config, engine_factory, startup)
    admission = AdmissionController(config.max_in_flight, config.max_queue, config.queue_timeout_seconds)
    metrics = RuntimeMetrics(lambda: admission.in_flight, lambda: admission.queue_depth)
    host.startup.subscribe(metrics.record_startup)
    serving = OpenAIServing(host, metrics)

    tracer = start_tracing("servlane-runtime")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        host.startup.mark("imports_done")  # our code is in, the server is about to listen
        loading = asyncio.create_task(host.load(), name="model-load")
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await host.close()
            if tracer is not None:
                stop_tracing()

    app = FastAPI(title="servlane runtime", lifespan=lifespan)
    app.state.host = host
    app.state.admission = admission
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_exception_handler(EngineError, _on_engine_error)
    _add_middleware(app, config, metrics, host.startup, tracer)
    _add_probes(app, host, serving)

    async def admitted(request: Request, model: str, run: Any) -> Response:
        """Check the model, take a slot (by priority), run, and answer JSON or SSE."""
        serving.check_model(model)  # 404/503 before queueing
        spans = spans_of(request.scope)
        spans.set(**{"gen_ai.request.model": model})
        with spans.phase("admission"):
            slot = await admission.acquire(parse_priority(request.headers.get("x-priority")))
        try:
            result = await unless_client_leaves(request.scope, request.receive, run())
        except ClientGone:
            slot.release()
            raise OpenAIError(499, "client closed the request", code="client_closed_request") from None
        except BaseException:
            slot.release()
            raise
        if isinstance(result, BaseModel):
            slot.release()
            return JSONResponse(result.model_dump(mode="json"))
        return SlotStreamingResponse(result, slot)

    @app.post("/v1/chat/completions")
    async def chat(body: p.ChatCompletionRequest, request: Request) -> Response:
        return await admitted(request, body.model, lambda: serving.chat(body, spans_of(request.scope)))

    @app.post("/v1/completions")
    async def completions(body: p.CompletionRequest, request: Request) -> Response:
        return await admitted(request, body.model, lambda: serving.completions(body, spans_of(request.scope)))

    @app.post("/v1/embeddings")
    async def embeddings(body: p.EmbeddingRequest, request: Request) -> Response:
        return await admitted(request, body.model, lambda: serving.embeddings(body))

    return app


async def _on_engine_error(_: Request, exc: Exception) -> JSONResponse:
    error = OpenAIError(500, str(exc), type="server_error", code="engine_error")
    return JSONResponse(error.body(), status_code=500)


def _add_middleware(
    app: FastAPI, config: RuntimeConfig, metrics: RuntimeMetrics, startup: StartupClock, tracer: Any | None
) -> None:
    """Each added one wraps those before it: the request guard innermost, the metrics port outermost."""
    limits = RequestLimits(
        max_body_bytes=config.max_body_bytes,
        max_json_depth=config.max_json_depth,
        max_list_items=config.max_list_items,
    )
    app.add_middleware(RequestGuard, limits=limits)  # inside the metrics: its 413s and 400s are counted
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(FirstRequestStamp, startup=startup)  # outside the guard: stamped before the body is read
    if tracer is not None:  # outermost but one: the span covers the whole request, its trace id every answer
        app.add_middleware(TracingMiddleware, tracer=tracer)
    # Outermost: the metrics port serves /metrics only, and the API port (the routes above) has none.
    app.add_middleware(MetricsPort, port=config.metrics_port, metrics=metrics, startup=startup)


def ready_wait(value: str | None) -> float:
    """Seconds a GET /ready may wait for the model to settle: ?wait= clamped to [0, READY_MAX_WAIT_SECONDS];
    absent or not a number: 0 (a probe is answered, never refused)."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(seconds, READY_MAX_WAIT_SECONDS) if seconds > 0 else 0.0  # NaN > 0 is False


def _add_probes(app: FastAPI, host: ModelHost, serving: OpenAIServing) -> None:
    """Liveness, readiness and the model list: answered at once, never admitted."""

    @get_and_head(app, HEALTH_PATH)
    async def health() -> JSONResponse:
        # Failed (the model did not load, or the engine died) is not alive: the process is about to
        # exit, and until then a liveness probe and a person both see why.
        if host.state == "failed":
            return JSONResponse({"status": "failed", "reason": host.reason}, status_code=503)
        return JSONResponse({"status": "alive"})

    @get_and_head(app, READY_PATH)
    async def ready(request: Request) -> JSONResponse:
        # ?wait=SECONDS: the gateway holding requests for this starting model hears of ready when it happens.
        await host.until_settled(ready_wait(request.query_params.get(READY_WAIT_PARAM)))
        return JSONResponse(host.readiness(), status_code=200 if host.state == "ready" else 503)

    @get_and_head(app, "/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(serving.models().model_dump(mode="json"))

    @get_and_head(app, "/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        # OpenAI's retrieve (the openai SDK's models.retrieve): the card from the list, else model_not_found.
        card = next((c for c in serving.models().data if c.id == model), None)
        if card is None:
            raise model_not_found(model)
        return JSONResponse(card.model_dump(mode="json"))
