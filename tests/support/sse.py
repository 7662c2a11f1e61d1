"""Reading an SSE stream line by line as SSE ends its lines, for tests and benches.

Not httpx's iter_lines/aiter_lines: they split as str.splitlines() does, also at U+2028, U+2029, U+0085 and
other separators, which a JSON string may hold unescaped (our servers write JSON with ensure_ascii=False). A
sampled token holding one cut a chunk in two, and the half failed to parse: a flaky failure, not a server bug.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx


def _split(pending: bytes, data: bytes) -> tuple[list[str], bytes]:
    *ended, rest = (pending + data).split(b"\n")
    return [(line[:-1] if line.endswith(b"\r") else line).decode("utf-8") for line in ended], rest


def sse_lines(response: httpx.Response) -> Iterator[str]:
    """The stream's lines, each without its LF (or CRLF)."""
    pending = b""
    for data in response.iter_bytes():
        lines, pending = _split(pending, data)
        yield from lines
    if pending:
        yield pending.decode("utf-8")


async def asse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """sse_lines for an async client's response."""
    pending = b""
    async for data in response.aiter_bytes():
        lines, pending = _split(pending, data)
        for line in lines:
            yield line
    if pending:
        yield pending.decode("utf-8")
