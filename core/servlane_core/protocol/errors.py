"""The one error shape of every OpenAI-compatible endpoint (runtime and gateway alike).

`{"error": {"message", "type", "param", "code"}}` with the right HTTP status. Code raises `OpenAIError`
(or a subclass); `install_error_handlers(app)` maps it, FastAPI's validation errors and anything
unexpected to that shape in one place, so no endpoint ever answers a bare 500 with a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class OpenAIError(Exception):
    """An error that reaches the client as OpenAI-style JSON with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}


def model_not_found(model: str) -> OpenAIError:
    """OpenAI's own wording: the same answer whether the model is missing or the key may not see it."""
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def overloaded(status: int, message: str, retry_after: float) -> OpenAIError:
    """429 (queue full) or 503 (waited too long / not ready), always with Retry-After."""
    return OpenAIError(status, message, type="server_error", code="service_overloaded", retry_after=retry_after)


def install_error_handlers(app: Any) -> None:
    """Map OpenAIError, request validation errors and unexpected exceptions to the error shape."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def on_openai_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
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
