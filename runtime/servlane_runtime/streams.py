"""Small async helpers: merge several generations into one stream; SSE framing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import BaseModel

from servlane_core.protocol import openai as p

from .engines.base import GenerationDelta

_END = object()


async def merge_generations(
    streams: list[AsyncGenerator[GenerationDelta, None]],
) -> AsyncGenerator[tuple[int, GenerationDelta], None]:
    """Deltas of all `streams` as they come, tagged with the stream's index (for n > 1).

    Closing the merged stream cancels and closes every source, so the engines stop generating.
    """
    if len(streams) == 1:  # the usual case (n=1, one prompt): no task and queue hop per token
        only = streams[0]
        try:
            async for delta in only:
                yield 0, delta
        finally:
            await only.aclose()
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[GenerationDelta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except Exception as exc:  # re-raised in the consumer
            await queue.put((index, exc))
        finally:
            await stream.aclose()
            await queue.put((index, _END))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            index, item = await queue.get()
            if item is _END:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def sse(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class ContentChunkFrames:
    """SSE frames of the chunk sent for every token (choice 0, new content only), without pydantic.

    Building and dumping three models per token was the largest cost of streaming under load; the
    frame is the same JSON, cut from one dump at a placeholder, with only the text encoded per call.
    """

    _MARK = "\x00content\x00"

    def __init__(self, request_id: str, created: int, model: str) -> None:
        choice = p.ChatChunkChoice(index=0, delta=p.ChatDelta(content=self._MARK))
        template = sse(p.ChatCompletionChunk(id=request_id, created=created, model=model, choices=[choice]))
        self._head, self._tail = template.split(json.dumps(self._MARK), 1)

    def frame(self, text: str) -> str:
        return f"{self._head}{json.dumps(text, ensure_ascii=False)}{self._tail}"
