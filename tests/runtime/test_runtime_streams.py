"""The streaming fast paths produce exactly what the general (pydantic, merged) paths would."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import pytest

from servlane_core.protocol import openai as p
from servlane_runtime.engines.base import GenerationDelta
from servlane_runtime.streams import ContentChunkFrames, merge_generations, sse


@pytest.mark.parametrize("text", ["a", ' "quoted" \n\t\\ ', "é😀\u2028", "\x00\x1f", ""])
def test_content_frames_equal_the_pydantic_chunk(text: str) -> None:
    frames = ContentChunkFrames("chatcmpl-1", 1700000000, 'tiny"llama')
    chunk = p.ChatCompletionChunk(
        id="chatcmpl-1",
        created=1700000000,
        model='tiny"llama',
        choices=[p.ChatChunkChoice(index=0, delta=p.ChatDelta(content=text))],
    )
    got = frames.frame(text)
    assert got == sse(chunk)
    assert json.loads(got.removeprefix("data: "))["choices"][0]["delta"]["content"] == text


async def test_single_stream_merge_yields_all_and_closing_closes_the_source() -> None:
    closed: list[str] = []

    async def source(name: str, count: int) -> AsyncGenerator[GenerationDelta, None]:
        try:
            for i in range(count):
                yield GenerationDelta(f"{name}{i}", 1, i + 1)
        finally:
            closed.append(name)

    whole = [(i, d.text) async for i, d in merge_generations([source("a", 3)])]
    assert whole == [(0, "a0"), (0, "a1"), (0, "a2")]
    assert closed == ["a"]

    merged = merge_generations([source("b", 100)])
    assert (await anext(merged))[1].text == "b0"
    await merged.aclose()
    assert closed == ["a", "b"]

    two = sorted([(i, d.text) async for i, d in merge_generations([source("c", 2), source("d", 1)])])
    assert two == [(0, "c0"), (0, "c1"), (1, "d0")]
