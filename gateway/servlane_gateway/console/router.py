"""The console's HTTP side: the page, its static files (package data, nothing fetched at run time) and its
JSON, authenticated exactly as /v1/models (the page sends the key it keeps in sessionStorage as a header)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from servlane_api import AIFeature, AIModel
from servlane_gateway.console.recent import RequestLog
from servlane_gateway.console.view import batches_owner, build_view
from servlane_gateway.state import GatewayState
from servlane_web.routes import get_and_head

STATIC = Path(__file__).parent / "static"
ObjectsGetter = Callable[[], tuple[list[AIFeature], list[AIModel]]]
# The Batch API's newest batches of an owner (None: everyone's); None when it is off or unavailable.
BatchesGetter = Callable[[str | None], Awaitable[list[dict[str, Any]] | None]]
# Our own files only: no inline script or style, no other origin (the page renders names users chose).
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def install_console(
    app: FastAPI,
    state: GatewayState,
    objects: ObjectsGetter,
    log: RequestLog,
    trace_url_template: str | None,
    batches: BatchesGetter | None = None,
) -> None:
    router = APIRouter()

    @get_and_head(router, "/console", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "console.html", media_type="text/html", headers=PAGE_HEADERS)

    @get_and_head(router, "/console/api/state", include_in_schema=False)
    async def console_state(request: Request) -> JSONResponse:
        key = state.keys.authenticate(request.headers.get("authorization"))
        features, models = objects()
        latest = await batches(batches_owner(key)) if batches is not None else None
        view: dict[str, Any] = build_view(state.table, features, models, log, key, trace_url_template, latest)
        return JSONResponse(view, headers={"cache-control": "no-store"})

    app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
