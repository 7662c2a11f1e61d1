"""A streamed request held for a model with no ready pod: its response head at once, then keep-alives.

Proxies, load balancers and SDKs give up on a request whose response has not begun within their read
timeout (often 60 s, less than a cold start). So a held stream gets `200 text/event-stream` at once and an
SSE comment (`: keep-alive`, which SSE clients ignore) every few seconds while it waits; once a pod is
ready the backend's stream follows in the same body. A wait that fails (too long, the model gone, the
backend refusing) ends the stream with an OpenAI-style error event, as a failure mid-stream does
(proxy.sse_error): the openai client raises APIError on it. A client that leaves while held frees its
place at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from servlane_core.protocol.errors import OpenAIError
from servlane_core.routing.routes import Backend
from servlane_gateway.http.proxy import RelayResponse
from servlane_gateway.routing.hold import Ticket
from servlane_web.client_watch import ClientGone, unless_client_leaves

log = logging.getLogger(__name__)

KEEP_ALIVE = b": keep-alive\n\n"
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def error_event(error: dict[str, Any]) -> bytes:
    """An OpenAI-style error event from an error object (`message`, `type`, `param`, `code`)."""
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def _event_of_answer(response: Response) -> bytes:
    """The backend answered the stream with a plain (error) answer: its error object, else a generic one."""
    try:
        parsed = json.loads(bytes(response.body))
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return error_event(parsed["error"])
    message = f"The backend answered with status {response.status_code}."
    return error_event({"message": message, "type": "server_error", "param": None, "code": response.status_code})


class HeldStreamResponse(Response):
    def __init__(
        self,
        ticket: Ticket,
        keep_alive: float,
        forward: Callable[[Backend], Awaitable[Response]],
        failed: Callable[[OpenAIError], None],
        client_left: Callable[[], None],
    ) -> None:
        super().__init__(status_code=200)
        self.raw_headers = list(HEADERS)
        self.ticket = ticket
        self.keep_alive = keep_alive
        self.forward = forward  # the request to the released backend (forwarding._to_backend)
        self.failed = failed  # counts a failure, as forwarding.handle does for an unheld request
        self.client_left = client_left

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

            async def keep_alive() -> None:
                await send({"type": "http.response.body", "body": KEEP_ALIVE, "more_body": True})

            waiting = self.ticket.wait(keep_alive, self.keep_alive)
            backend = await unless_client_leaves(scope, receive, waiting)
            answer = await self.forward(backend)
        except (ClientGone, ClientDisconnect, OSError):  # OSError: a keep-alive's send found the client gone
            self.client_left()
            return
        except OpenAIError as exc:
            self.failed(exc)
            await _end(send, error_event(exc.body()["error"]))
            return
        except Exception:  # a bug: the stream still ends with one error shape, and is still counted
            log.exception("unexpected error while a held stream waited")
            error = OpenAIError(500, "The gateway had an error while processing your request.", type="server_error")
            self.failed(error)
            await _end(send, error_event(error.body()["error"]))
            return
        finally:
            self.ticket.leave()
        if isinstance(answer, RelayResponse):
            await answer.relay(scope, receive, send, headers_sent=True)
        else:  # counted where it was answered (answers.respond)
            await _end(send, _event_of_answer(answer))


async def _end(send: Send, event: bytes) -> None:
    """The last event, and the end of the body (a client gone meanwhile is no error)."""
    try:
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass
