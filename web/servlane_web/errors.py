"""FastAPI's side of the one error shape (`servlane_core.protocol.errors`), for the runtime and the gateway.

`install_error_handlers(app)` maps OpenAIError, FastAPI's validation errors, HTTP errors and anything
unexpected to `{"error": {...}}` with the right status, so no endpoint answers a bare 500 with a traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from servlane_core.protocol.errors import OpenAIError

log = logging.getLogger(__name__)

# The names pydantic gives the branches of a union in an error's location (`messages.0.content.str`): not
# fields, so not the param a client is told. The protocol's fields are snake_case and none is named so.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_union_tag(part: object) -> bool:
    if not isinstance(part, str):
        return False
    return part in _TYPE_NAMES or part[:1].isupper() or any(c in part for c in "[]()'")


def install_error_handlers(app: FastAPI) -> None:
    """Map OpenAIError, request validation errors and unexpected exceptions to the error shape."""

    async def on_openai_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_union_tag(p)]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid request')}" if param else str(first.get("msg", "invalid"))
        error = OpenAIError(400, message, param=param, code="invalid_request")
        return JSONResponse(error.body(), status_code=400)

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        error = OpenAIError(exc.status_code, str(exc.detail), type=kind)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        error = OpenAIError(500, "The server had an error while processing your request.", type="server_error")
        return JSONResponse(error.body(), status_code=500)

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
