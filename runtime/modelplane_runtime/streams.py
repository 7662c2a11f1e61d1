"""Small async helpers: merge several generations into one stream; SSE framing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import BaseModel

from .engines.base import GenerationDelta

_END = object()


async def merge_generations(
    streams: list[AsyncGenerator[GenerationDelta, None]],
) -> AsyncGenerator[tuple[int, GenerationDelta], None]:
    """Deltas of all `streams` as they come, tagged with the stream's index (for n > 1).

    Closing the merged stream cancels and closes every source, so the engines stop generating.
    """
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
