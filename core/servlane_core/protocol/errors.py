"""The one error shape of every OpenAI-compatible endpoint (runtime and gateway alike).

`{"error": {"message", "type", "param", "code"}}` with the right HTTP status. Code raises `OpenAIError`
(or a subclass); `servlane_web.errors.install_error_handlers(app)` maps it, FastAPI's validation errors
and anything unexpected to that shape in one place, so no endpoint ever answers a bare 500 with a traceback.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


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
