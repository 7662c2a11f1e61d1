"""uvicorn's settings for the runtime: the same in `python -m servlane_runtime` and in the tests' servers."""

from __future__ import annotations

from typing import Any

from servlane_web.http_server import ServlaneHttpProtocol


def server_options() -> dict[str, Any]:
    """The gateway's protocol (servlane_web.http_server), with its default deadlines: a client's head must
    arrive within 30 s and its body may pause at most 60 s (else a 408), so a client that stops sending holds
    neither its connection for good nor, mid-request, SIGTERM's drain (which waits for requests in flight);
    what is not HTTP gets a 400 in the OpenAI error shape; a whole answer goes out in one write."""
    return {"http": ServlaneHttpProtocol}
