"""FastAPI's side of the one error shape (`servlane_core.protocol.errors`), for the runtime and the gateway.

`install_error_handlers(app)` maps OpenAIError, FastAPI's validation errors, HTTP errors and anything
unexpected to `{"error": {...}}` with the right status, so no endpoint answers a bare 500 with a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

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
    # constrained-str, constrained-int: a type with bounds (Field(min_length=1)) as a union's branch.
    return (
        part in _TYPE_NAMES or part[:1].isupper() or part.startswith("constrained-") or any(c in part for c in "[]()'")
    )


def _is_type_mismatch(error: Any) -> bool:
    """string_type, int_parsing, model_type...: the value is not of that branch's type at all."""
    return str(error.get("type", "")).endswith(("_type", "_parsing"))


def _field_path(error: Any) -> list[str]:
    return [str(part) for part in error.get("loc", ()) if part != "body" and not _is_union_tag(part)]


def install_error_handlers(app: FastAPI) -> None:
    """Map OpenAIError, request validation errors and unexpected exceptions to the error shape."""

    async def on_openai_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # Of a union's branches, the one the value got furthest into is the shape the client meant: the error
        # deepest into the body, and of those, one with the value's type right but its bounds wrong (input [-1]:
        # "greater than or equal to 0", not "should be a valid string"); the first such.
        errors = list(exc.errors())
        chosen: Any = max(errors, key=lambda e: (len(_field_path(e)), not _is_type_mismatch(e)), default={})
        param = ".".join(_field_path(chosen)) or None
        message = chosen.get("msg", "invalid request")
        message = f"{param}: {message}" if param else str(message)
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
