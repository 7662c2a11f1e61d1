"""Which chats are rendered and tokenized on the runtime's event loop: text_size must see every part of a request
that makes the template's work large, so nothing big runs on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from servlane_runtime.serving import INLINE_CHARS, off_loop_if_long, text_size


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("hello", 5),
        ([{"role": "user", "content": "hi"}], len("role") + len("user") + len("content") + len("hi")),
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, 4 + 6 + 10 + 1 + 4 + 7),
        ([1, 2.5, None, True], 4),
        ([], 0),
    ],
)
def test_strings_keys_and_other_values_count(value: object, size: int) -> None:
    assert text_size(value) == size


@pytest.mark.parametrize(
    "big",
    [
        [{"role": "user", "content": "x" * (INLINE_CHARS + 1)}],
        [{"role": "user", "content": ""}] * 1000,  # many empty messages: the roles and keys add up
        [{"type": "function", "function": {"parameters": {"enum": list(range(100_000))}}}],  # numbers, no text
        [{"role": "user", "content": [{"type": "text", "text": "y" * 3000}, {"type": "text", "text": "z" * 3000}]}],
    ],
)
def test_large_requests_are_past_the_limit(big: object) -> None:
    assert text_size(big) > INLINE_CHARS


def test_counting_stops_soon_after_the_limit() -> None:
    huge = ["word"] * 10_000_000
    assert INLINE_CHARS < text_size(huge) <= INLINE_CHARS + len("word")


def test_short_work_runs_here_and_long_work_in_a_thread() -> None:
    async def where(chars: int) -> str:
        return await off_loop_if_long(chars, lambda: threading.current_thread().name)

    here = threading.current_thread().name
    assert asyncio.run(where(INLINE_CHARS)) == here
    assert asyncio.run(where(INLINE_CHARS + 1)) != here
