"""The OpenAI endpoints the gateway forwards, each defined once: the fast path serves them and the OpenAPI
document describes them from this table.

An endpoint here is an OpenAI path (`chat/completions`); the pods behind a backend are picked in
`servlane_gateway.routing.pods`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response

from servlane_core.protocol import openai as p


@dataclass(frozen=True)
class Endpoint:
    """One forwarded endpoint: its name (what the request pipeline is told), its request body's model (for the
    OpenAPI document only: the backend validates) and the name of its operation in that document."""

    name: str
    body: type[BaseModel]
    operation: str

    @property
    def path(self) -> str:
        return f"/v1/{self.name}"


ENDPOINTS = (
    Endpoint("chat/completions", p.ChatCompletionRequest, "chat_completions"),
    Endpoint("completions", p.CompletionRequest, "completions"),
    Endpoint("embeddings", p.EmbeddingRequest, "embeddings"),
)
BY_PATH = {e.path: e.name for e in ENDPOINTS}  # what the fast path forwards: a POST to one of these paths

Handle = Callable[[Request, str], Awaitable[Response]]


def document(app: FastAPI, handle: Handle) -> None:
    """The endpoints as routes with the runtime's request models: for the OpenAPI schema (clients, the schema
    fuzz) and for other methods (405). POSTs never get here (the fast path takes them first), so the gateway
    itself never validates beyond its limits: the backend does, and its 400s are relayed."""
    for endpoint in ENDPOINTS:
        app.add_api_route(endpoint.path, _route(endpoint, handle), methods=["POST"], name=endpoint.operation)


def _route(endpoint: Endpoint, handle: Handle) -> Callable[..., Awaitable[Response]]:
    async def route(request: Request, **_: object) -> Response:
        return await handle(request, endpoint.name)

    # FastAPI reads the parameters from the signature: the body's model (documented) and the request.
    route.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=endpoint.body),
            inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        ],
        return_annotation=Response,
    )
    return route
