"""tests.support.sse: a stream's lines end at LF (or CRLF) only, however the bytes arrive, so JSON whose strings
hold U+2028 or U+0085 unescaped stays one line (httpx's iter_lines cut such a chunk in two)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx

from tests.support.sse import asse_lines, sse_lines

EVENT = json.dumps({"choices": [{"delta": {"content": "a\u2028b\u2029c\x85d é"}}]}, ensure_ascii=False)
STREAM = f"data: {EVENT}\n\n: keep-alive\r\ndata: [DONE]\n\n".encode()
LINES = [f"data: {EVENT}", "", ": keep-alive", "data: [DONE]", ""]


class Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    def __init__(self, size: int) -> None:
        self.parts = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]

    def __iter__(self) -> Iterator[bytes]:
        yield from self.parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def test_lines_end_at_lf_only_however_the_stream_is_cut() -> None:
    for size in range(1, len(STREAM) + 1):
        assert list(sse_lines(httpx.Response(200, stream=Chunks(size)))) == LINES, size


def test_the_async_reader_reads_the_same_lines() -> None:
    async def read(size: int) -> list[str]:
        return [line async for line in asse_lines(httpx.Response(200, stream=Chunks(size)))]

    for size in (1, 2, 7, len(STREAM)):
        assert asyncio.run(read(size)) == LINES, size
    assert json.loads(LINES[0][6:])["choices"][0]["delta"]["content"] == "a\u2028b\u2029c\x85d é"
