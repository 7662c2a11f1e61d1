"""Tool calling: the tools (get_weather, a clock) and the checks that both engines and the gateway run alike."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolParam,
)

MODEL = "tiny-llama"
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


CLOCK: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "precise": {"type": "boolean"}},
            "required": ["zone", "precise"],
            "additionalProperties": False,
        },
    },
}


TOOLS = [WEATHER, CLOCK]

# Parameters that point into themselves, as pydantic and the openai SDK write nested models (`$defs`) and older
# generators do (`definitions`): set inside the forced calls' array, their `$ref`s must still find their target.
_PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
BOOKING: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {
            "type": "object",
            "properties": {"start": {"$ref": "#/$defs/Place"}, "end": {"$ref": "#/definitions/Place"}},
            "required": ["start", "end"],
            "additionalProperties": False,
            "$defs": {"Place": _PLACE},
            "definitions": {"Place": _PLACE},
        },
    },
}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]


# Room for a few calls: a random model inside the grammar still has to reach the end of the JSON.
ROOM = 400


def parameters_of(name: str) -> dict[str, Any]:
    tool = next(t for t in [*TOOLS, BOOKING] if t["function"]["name"] == name)
    return dict(tool["function"]["parameters"])


def assert_valid_calls(
    reply: ChatCompletion, allowed: set[str], *, at_most: int | None = None, finish: str = "tool_calls"
) -> None:
    """Every choice answered with tool calls only, each to an allowed tool with arguments valid for it; a
    function tool_choice named finishes with `stop` (OpenAI's and vLLM's reason), others with `tool_calls`."""
    for choice in reply.choices:
        calls = choice.message.tool_calls
        assert calls, f"no tool calls: {choice.message}"
        assert choice.finish_reason == finish
        assert choice.message.content is None
        if at_most is not None:
            assert len(calls) <= at_most
        for call in calls:
            assert call.type == "function"
            assert call.id.startswith("call_")
            assert call.function.name in allowed
            jsonschema.validate(json.loads(call.function.arguments), parameters_of(call.function.name))
        assert len({c.id for c in calls}) == len(calls)


def check_named_tool(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=ROOM,
        n=3,
        seed=3,
    )
    assert_valid_calls(reply, {"get_time"}, at_most=1, finish="stop")


def check_parameters_with_references(client: openai.OpenAI) -> None:
    """Forced calls of a tool whose parameters use `$ref` (beside one that does not): valid calls, never a 400
    for a reference the forced calls' schema lost."""
    named: ChatCompletionToolChoiceOptionParam = {"type": "function", "function": {"name": "book"}}
    choices: list[ChatCompletionToolChoiceOptionParam] = ["required", named]
    for tool_choice in choices:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[BOOKING, CLOCK],
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=ROOM,
            n=2,
            seed=7,
        )
        if tool_choice == "required":
            assert_valid_calls(reply, {"book", "get_time"}, at_most=1)
        else:
            assert_valid_calls(reply, {"book"}, at_most=1, finish="stop")


def check_required_one_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=ROOM,
        n=3,
        seed=5,
    )
    assert_valid_calls(reply, {"get_weather", "get_time"}, at_most=1)


def check_required_parallel(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=ROOM, n=4, seed=11
    )
    assert_valid_calls(reply, {"get_weather", "get_time"})
    # The guided schema allows an array of calls: over 4 seeded samples, some answer makes several.
    assert max(len(c.message.tool_calls or []) for c in reply.choices) >= 2


def check_stream_reassembles(client: openai.OpenAI) -> None:
    """The streamed deltas (OpenAI's shape) rebuild exactly the calls of the same seeded request unstreamed.

    Sampled, not greedy: the greedy tiny model repeats its first call until max_tokens."""
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": ROOM,
        "seed": 11,
    }
    whole = client.chat.completions.create(**request)
    assert_valid_calls(whole, {"get_weather", "get_time"})
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or []:
                assert piece.function is not None
                if piece.index not in calls:  # the first piece of a call: id, type and name
                    assert piece.id
                    assert piece.type == "function"
                    assert piece.function.name
                    calls[piece.index] = {"name": piece.function.name, "arguments": ""}
                else:  # later pieces: argument text only
                    assert piece.id is None
                    assert piece.function.name is None
                calls[piece.index]["arguments"] += piece.function.arguments or ""
    assert finish == "tool_calls"
    expected = [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.choices[0].message.tool_calls or []
    ]
    assert [calls[i] for i in sorted(calls)] == expected


def check_none_never_calls(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=16, n=2, seed=1
    )
    for choice in reply.choices:
        assert not choice.message.tool_calls
        assert isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")


def check_history_with_calls(client: openai.OpenAI) -> None:
    """An assistant turn with tool calls and the tool's result, sent back: the template renders both."""
    history: list[ChatCompletionMessageParam] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    short = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=1)
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=4)
    assert reply.usage is not None
    assert short.usage is not None
    # The call (name and arguments) and the result are in the prompt: many more tokens than the question.
    assert reply.usage.prompt_tokens > short.usage.prompt_tokens + 20


def error_of(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json()["error"])


BAD_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "named tool not in tools": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "named tool without tools": ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
    "two tools with one name": ({"tools": [WEATHER, WEATHER]}, "tools"),
    "forced call and a json response": (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
    ),
    "json_schema type without a schema": ({"response_format": {"type": "json_schema"}}, "response_format"),
    "unknown tool_choice": ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    "tool without a function": ({"tools": [{"type": "function"}]}, "tools.0.function"),
    "bad function name": (
        {"tools": [{"type": "function", "function": {"name": "has spaces"}}]},
        "tools.0.function.name",
    ),
}


def check_bad_request(base_url: str, fields: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    response = httpx.post(base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] is not None
    assert str(error_of(response)["param"]).startswith(param), response.text
