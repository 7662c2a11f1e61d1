"""The request limits both servers apply before pydantic: size (413), nesting, list lengths and JSON (400)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servlane_core.protocol import openai as p
from servlane_core.protocol.errors import OpenAIError
from servlane_core.protocol.limits import RequestLimits, check_shape, parse_json_object, within_by_counting

LIMITS = RequestLimits(max_body_bytes=10_000, max_json_depth=8, max_list_items=5)


def nested(depth: int, open_: str = "[", close: str = "]") -> bytes:
    """A body whose deepest value sits `depth` containers down (the body object itself is level 1)."""
    return ('{"x": ' + open_ * (depth - 1) + "1" + close * (depth - 1) + "}").encode()


def rejected(raw: bytes, limits: RequestLimits = LIMITS) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        parse_json_object(raw, limits)
    return caught.value


def test_nesting_up_to_the_cap_passes_and_one_more_is_400() -> None:
    assert parse_json_object(nested(8), LIMITS)["x"]
    assert parse_json_object(nested(8, '{"a":', "}"), LIMITS)["x"]
    for raw in (nested(9), nested(9, '{"a":', "}")):
        error = rejected(raw)
        assert (error.status, error.code) == (400, "too_deeply_nested")


def test_five_thousand_levels_are_a_400_not_a_recursion_error() -> None:
    for raw in (b"[" * 5000 + b"]" * 5000, nested(5000), nested(100_000, '{"a":', "}")):
        error = rejected(raw, RequestLimits())
        assert (error.status, error.code) == (400, "too_deeply_nested")
        assert "64 levels" in error.message


def test_every_array_is_capped_and_the_error_names_where() -> None:
    messages = [{"role": "user", "content": "hi"}] * 6
    error = rejected(json.dumps({"model": "m", "messages": messages}).encode())
    assert (error.status, error.code, error.param) == (400, "too_many_items", "messages")
    assert "at most 5 items" in error.message
    parts = [{"type": "text", "text": "a"}] * 6
    deep = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    assert rejected(json.dumps(deep).encode()).param == "messages.0.content"
    assert rejected(json.dumps({"model": "m", "input": ["a"] * 6}).encode()).param == "input"
    assert parse_json_object(json.dumps({"model": "m", "prompt": ["a"] * 5}).encode(), LIMITS)["prompt"]


def test_a_body_over_the_cap_is_413() -> None:
    error = rejected(json.dumps({"model": "m", "prompt": "x" * 10_000}).encode())
    assert (error.status, error.code) == (413, "request_too_large")
    assert error.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "raw",
    [b"", b"{not json", b'{"a": NaN}', b'{"a": Infinity}', b'{"a": "\\ud800"}', b"[1, 2]", b'"text"', b"null"],
)
def test_not_a_json_object_is_400(raw: bytes) -> None:
    error = rejected(raw)
    assert (error.status, error.code) == (400, "invalid_json")


def test_limits_are_validated_settings() -> None:
    with pytest.raises(ValidationError):
        RequestLimits(max_json_depth=1000)  # beyond what the parser itself allows: it would claim the wrong cap
    with pytest.raises(ValidationError):
        RequestLimits(max_list_items=0)


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"top_p": 5e-324},  # vLLM accepts it, so the engines must serve it (not a 400, and not a 500)
        {"temperature": 1e-300},
        {"seed": p.SEED_MAX},
        {"seed": p.SEED_MIN},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"max_tokens": 10**30},
    ],
)
def test_values_vllm_accepts_are_accepted(fields: dict[str, object]) -> None:
    p.ChatCompletionRequest.model_validate(chat(**fields))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seed": p.SEED_MAX + 1}, "seed"),
        ({"seed": p.SEED_MIN - 1}, "seed"),
        ({"seed": 10**400}, "seed"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.0000001}, "top_p"),
        ({"temperature": -1e-300}, "temperature"),
        ({"temperature": 2.0000001}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
    ],
)
def test_values_vllm_refuses_are_refused(fields: dict[str, object], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        p.ChatCompletionRequest.model_validate(chat(**fields))
    assert caught.value.errors()[0]["loc"][0] == param


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab,[]{}"', max_size=4),
    lambda children: st.lists(children, max_size=7) | st.dictionaries(st.text(max_size=3), children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(body=st.dictionaries(st.text(max_size=3), _JSON, max_size=4), depth=st.integers(2, 6), items=st.integers(1, 6))
def test_counting_never_passes_a_body_the_walk_refuses(body: dict[str, object], depth: int, items: int) -> None:
    """The shortcut (within_by_counting) skips the walk only for bodies the walk passes."""
    limits = RequestLimits(max_body_bytes=1 << 20, max_json_depth=depth, max_list_items=items)
    raw = json.dumps(body).encode()
    if within_by_counting(raw, limits):
        check_shape(json.loads(raw), limits)  # raises if the shortcut let a bad body through


def test_counting_takes_a_chat_turn_and_leaves_a_long_conversation_to_the_walk() -> None:
    turn = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi, [you] {there}"}]}).encode()
    assert within_by_counting(turn, RequestLimits())
    messages = [{"role": "user", "content": str(i)} for i in range(100)]
    assert not within_by_counting(json.dumps({"model": "m", "messages": messages}).encode(), RequestLimits())
    too_many = json.dumps({"model": "m", "stop": ["x"] * 6}).encode()
    assert not within_by_counting(too_many, LIMITS)
    assert rejected(too_many).code == "too_many_items"
