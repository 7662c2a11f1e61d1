"""The gateway's response for a backend's whole answer (servlane_gateway.answers.WholeAnswer) is what Starlette's
Response makes of the same content, status and headers: the same status, body and header lines in the same order,
a Content-Length where Response gives one and none where it gives none."""

from __future__ import annotations

import pytest
from starlette.responses import Response

from servlane_gateway.answers import WholeAnswer
from servlane_gateway.cache.rules import CACHE_HEADER

HEADER_SETS = [
    {"content-type": "application/json"},
    {"content-type": "application/json", "x-request-id": "req-1", "retry-after": "3", CACHE_HEADER: "miss"},
    {"content-type": "text/event-stream"},
]


@pytest.mark.parametrize("status", [100, 200, 201, 204, 304, 400, 404, 429, 500, 503])
@pytest.mark.parametrize("headers", HEADER_SETS)
@pytest.mark.parametrize("body", [b"", b'{"id":"x","choices":[]}', "é".encode()])
def test_a_whole_answer_is_what_starlettes_response_makes(status: int, headers: dict[str, str], body: bytes) -> None:
    theirs = Response(body, status_code=status, headers=headers)
    ours = WholeAnswer(body, status, headers)
    assert ours.status_code == theirs.status_code
    assert ours.body == theirs.body
    assert ours.raw_headers == theirs.raw_headers
    assert ours.background is None
    assert theirs.background is None
