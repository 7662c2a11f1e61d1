"""The stream relay's usage scanner: its shortcut for chunks with nothing to see changes nothing it relays or
finds (checked against the scanner with the shortcut off, on random streams cut at random places)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servlane_gateway.http import proxy
from servlane_gateway.http.proxy import UsageScanner

_USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
_EVENTS = st.sampled_from(
    [
        b"data: " + json.dumps({"choices": [{"delta": {"content": "tok"}}], "usage": None}).encode(),
        b'data: {"choices":[{"delta":{"content":"a\\"usage\\""}}],"usage":null}',
        b"data: " + json.dumps({"choices": [], "usage": _USAGE}).encode(),
        b"data: " + json.dumps({"choices": [{"delta": {}}], "usage": _USAGE}).encode(),
        b'data: {"error": {"message": "boom"}}',
        b"data: [DONE]",
        b": keep-alive",
        b"data: not json",
    ]
)


def _run(scanner: UsageScanner, chunks: list[bytes]) -> tuple[bytes, object, bool, bool]:
    relayed = b"".join(scanner.feed(c) for c in chunks) + scanner.finish()
    return relayed, scanner.usage, scanner.saw_error, scanner.saw_done


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    events=st.lists(_EVENTS, max_size=12),
    ending=st.sampled_from([b"\n\n", b"\r\n\r\n"]),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    strip=st.booleans(),
)
def test_the_shortcut_relays_and_finds_what_the_full_scan_does(
    events: list[bytes], ending: bytes, cuts: list[int], strip: bool
) -> None:
    stream = b"".join(e + ending for e in events)
    at = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in pairwise(at) if b > a]
    with_shortcut = _run(UsageScanner(strip), chunks)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(proxy, "_nothing_to_see", lambda chunk: False)
        without = _run(UsageScanner(strip), chunks)
    assert with_shortcut == without


def test_a_token_chunk_is_relayed_as_it_came_and_the_usage_chunk_still_cut() -> None:
    scanner = UsageScanner(strip_usage=True)
    token = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    usage = b"data: " + json.dumps({"choices": [], "usage": _USAGE}).encode() + b"\n\n"
    assert scanner.feed(token) is token  # the very object: no split, no join
    assert scanner.feed(usage) == b""
    assert scanner.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    assert scanner.usage == _USAGE
    assert scanner.saw_done
