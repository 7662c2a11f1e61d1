"""The pure parts of tool calling: the request's plan, the hermes parser, and how a choice's text is split
into streamed content and tool calls (the part a random tiny model never exercises: it writes no
`<tool_call>` by itself)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from servlane_core.protocol import openai as p
from servlane_core.protocol.errors import OpenAIError
from servlane_core.protocol.tools import (
    OutputPlan,
    ParsedToolCall,
    calls_from_forced_json,
    plan_output,
    template_messages,
)
from servlane_runtime.tool_calls import ChoiceOutput, HermesToolParser

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
AUTO = OutputPlan("auto", [WEATHER], None)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def request(**fields: Any) -> p.ChatCompletionRequest:
    return p.ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | fields
    )


def test_hermes_parser_reads_content_and_parallel_calls() -> None:
    text = "Let me look." + CALL + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    content, calls = HermesToolParser().parse(text, [WEATHER])
    assert content == "Let me look."
    assert calls == [ParsedToolCall("get_weather", '{"city": "Paris"}'), ParsedToolCall("get_time", "{}")]


@pytest.mark.parametrize("text", ["no call here", "<tool_call>{not json}</tool_call>", '<tool_call>{"x": 1}'])
def test_hermes_parser_leaves_what_is_not_a_call_as_content(text: str) -> None:
    assert HermesToolParser().parse(text, []) == (text, [])


def test_an_unclosed_last_call_still_parses() -> None:
    """Generation may stop on EOS right after the JSON, before `</tool_call>`."""
    _, calls = HermesToolParser().parse('<tool_call>{"name": "get_time", "arguments": {}}', [])
    assert calls == [ParsedToolCall("get_time", "{}")]


def test_streamed_content_stops_where_a_call_may_begin() -> None:
    out = ChoiceOutput(AUTO, None)
    pieces = [
        "Hello <",
        "tool",
        "_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}',
        "</tool_call>",
    ]
    sent = "".join(out.push(piece) for piece in pieces)
    assert sent == "Hello "  # "<" and "<tool" were held back: they could have been (and were) a call's start
    assert out.finish() == ("", [ParsedToolCall("get_weather", '{"city": "Paris"}')])


def test_a_false_start_is_released_as_content() -> None:
    out = ChoiceOutput(AUTO, None)
    assert out.push("a <tool") == "a "
    assert out.push("box> b") == "<toolbox> b"
    assert out.finish() == ("", [])


def test_a_malformed_call_comes_back_as_content() -> None:
    out = ChoiceOutput(AUTO, None)
    assert out.push("x<tool_call>{oops") == "x"
    assert out.finish() == ("<tool_call>{oops", [])


def test_without_tools_everything_is_content_at_once() -> None:
    out = ChoiceOutput(OutputPlan("none", None, None), None)
    assert out.push(CALL) == CALL
    assert out.finish() == ("", [])


def test_forced_calls_are_read_from_the_guided_json() -> None:
    out = ChoiceOutput(OutputPlan("forced", [WEATHER], "{}"), None)
    assert out.push('[{"name": "get_weather", "arguments": {"city": "Rome"}}]') == ""
    assert out.finish() == ("", [ParsedToolCall("get_weather", '{"city": "Rome"}')])
    assert calls_from_forced_json('[{"name": "get_weather", "argu') == []  # cut off by max_tokens


def test_the_forced_schema_allows_one_call_or_several() -> None:
    def schema(**fields: Any) -> dict[str, Any]:
        plan = plan_output(request(tools=[WEATHER, CLOCK], tool_choice="required", **fields))
        assert plan.tool_mode == "forced"
        assert plan.json_schema is not None
        return dict(json.loads(plan.json_schema))

    two = [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]
    jsonschema.validate(two, schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(two, schema(parallel_tool_calls=False))
    with pytest.raises(jsonschema.ValidationError):  # the arguments follow the named function's parameters
        jsonschema.validate([{"name": "get_weather", "arguments": {}}], schema())
    with pytest.raises(jsonschema.ValidationError):  # a function without parameters takes none
        jsonschema.validate([{"name": "get_time", "arguments": {"x": 1}}], schema())


def test_a_named_function_allows_only_it() -> None:
    plan = plan_output(
        request(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}})
    )
    assert plan.json_schema is not None
    schema = json.loads(plan.json_schema)
    jsonschema.validate([{"name": "get_time", "arguments": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Oslo"}}], schema)


def test_plan_without_tools_or_with_none() -> None:
    assert plan_output(request()) == OutputPlan("none", None, None)
    assert plan_output(request(tools=[WEATHER], tool_choice="none")).tools is None
    assert plan_output(request(tool_choice="none")).tool_mode == "none"
    assert plan_output(request(tools=[WEATHER])).tool_mode == "auto"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_contradictions_are_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        plan_output(request(**fields))
    assert caught.value.status == 400
    assert caught.value.param == param


def test_history_arguments_reach_the_template_as_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = request(
        messages=[
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    ).messages
    assert template_messages(messages) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
