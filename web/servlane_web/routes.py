"""GET endpoints that answer HEAD too. RFC 9110 (9.1) asks every general-purpose server to support HEAD where it
supports GET, and load balancers and uptime checks probe with it; Starlette's own routes add it, FastAPI's do not
(a HEAD on /health was a 405). The HEAD route stays out of the OpenAPI schema: one operation per path and verb
there, as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def get_and_head(router: FastAPI | APIRouter, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
    """Like `router.get(path, **options)`, and the same endpoint for HEAD (uvicorn sends its head, no body)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(path, endpoint, methods=["GET"], **options)
        router.add_api_route(path, endpoint, methods=["HEAD"], **{**options, "include_in_schema": False})
        return endpoint

    return register
