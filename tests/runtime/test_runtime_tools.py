"""Tool calling on the transformers engine, through the official `openai` client.

The model is the tiny random Llama with a tool-capable template (tests/support/tool_model.py): it never
calls a tool by itself, so `required` and a named function must come from guided decoding, and every call
it returns must validate against its tool's parameters. The helpers are shared with the vLLM engine's tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam, ChatCompletionToolParam

from tests.runtime.conftest import tiny_config
from tests.support import tool_model
from tests.support.servers import InProcessServer

MODEL = "tiny-llama"
tools_model_dir = tool_model.tools_model_dir

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
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
# Room for a few calls: a random model inside the grammar still has to reach the end of the JSON.
ROOM = 400


@pytest.fixture(scope="module")
def tools_server(tools_model_dir: Path) -> Iterator[InProcessServer]:
    with InProcessServer(tiny_config(tools_model_dir)) as server:
        server.wait_ready()
        yield server


@pytest.fixture
def client(tools_server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tools_server.v1, api_key="unused", max_retries=0, timeout=120)


# ---- checks shared with the vLLM engine's tests --------------------------------------------------------


def parameters_of(name: str) -> dict[str, Any]:
    tool = next(t for t in TOOLS if t["function"]["name"] == name)
    return dict(tool["function"]["parameters"])


def assert_valid_calls(reply: ChatCompletion, allowed: set[str], *, at_most: int | None = None) -> None:
    """Every choice answered with tool calls only, each to an allowed tool with arguments valid for it."""
    for choice in reply.choices:
        calls = choice.message.tool_calls
        assert calls, f"no tool calls: {choice.message}"
        assert choice.finish_reason == "tool_calls"
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
    assert_valid_calls(reply, {"get_time"}, at_most=1)


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


# ---- the transformers engine ------------------------------------------------------------------------


def test_a_named_tool_is_always_called_with_valid_arguments(client: openai.OpenAI) -> None:
    check_named_tool(client)


def test_required_without_parallel_calls_makes_exactly_one_valid_call(client: openai.OpenAI) -> None:
    check_required_one_call(client)


def test_required_with_parallel_calls_makes_valid_calls(client: openai.OpenAI) -> None:
    check_required_parallel(client)


def test_streamed_tool_call_deltas_reassemble_to_the_same_calls(client: openai.OpenAI) -> None:
    check_stream_reassembles(client)


def test_tool_choice_none_never_returns_tool_calls(client: openai.OpenAI) -> None:
    check_none_never_calls(client)


def test_auto_with_a_model_that_calls_nothing_answers_content(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert not choice.message.tool_calls  # the random model writes no <tool_call>
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


def test_history_with_tool_calls_and_results_is_rendered(client: openai.OpenAI) -> None:
    check_history_with_calls(client)


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_contradictory_tool_requests_are_400(tools_server: InProcessServer, case: str) -> None:
    fields, param = BAD_REQUESTS[case]
    check_bad_request(tools_server.v1, fields, param)


def test_tools_for_a_template_without_tools_are_400(chat_server: InProcessServer) -> None:
    """The shared tiny model's template drops tools: serving it tools would hide them from the model."""
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4}
    response = httpx.post(chat_server.v1 + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "tools_not_supported"
    assert error_of(response)["param"] == "tools"
    # tool_choice none: the tools are not rendered, so the request is served as plain chat.
    body["tool_choice"] = "none"
    assert httpx.post(chat_server.v1 + "/chat/completions", json=body, timeout=60).status_code == 200
