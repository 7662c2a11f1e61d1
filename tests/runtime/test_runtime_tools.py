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
import openai
import pytest
from openai.types.chat import ChatCompletionToolChoiceOptionParam

from servlane_runtime.engines.base import RequestNotSupported
from servlane_runtime.serving import _error_frame
from tests.support import tool_model
from tests.support.servers import InProcessServer, tiny_config
from tests.support.tools import (
    ASK,
    BAD_REQUESTS,
    MODEL,
    TOOLS,
    check_bad_request,
    check_history_with_calls,
    check_named_tool,
    check_none_never_calls,
    check_parameters_with_references,
    check_required_one_call,
    check_required_parallel,
    check_stream_reassembles,
    error_of,
)

tools_model_dir = tool_model.tools_model_dir


@pytest.fixture(scope="module")
def tools_server(tools_model_dir: Path) -> Iterator[InProcessServer]:
    with InProcessServer(tiny_config(tools_model_dir)) as server:
        server.wait_ready()
        yield server


@pytest.fixture
def client(tools_server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tools_server.v1, api_key="unused", max_retries=0, timeout=120)


# ---- checks shared with the vLLM engine's tests --------------------------------------------------------


# ---- the transformers engine ------------------------------------------------------------------------


def test_a_named_tool_is_always_called_with_valid_arguments(client: openai.OpenAI) -> None:
    check_named_tool(client)


def test_parameters_that_use_references_get_valid_forced_calls(client: openai.OpenAI) -> None:
    check_parameters_with_references(client)


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


def test_a_schema_refused_midway_names_the_field_it_came_from() -> None:
    """Engines say response_format when guided decoding finds the schema admits nothing more; a forced call's
    schema came from `tools`. (A random model under a forced call's grammar takes whitespace before the value
    where the dead end would be, so this is the error frame itself, not a whole request.)"""
    refused = RequestNotSupported("the JSON schema admits no continuation", param="response_format")
    for schema_param in ("response_format", "tools"):
        error = json.loads(_error_frame(refused, schema_param).removeprefix("data: "))["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "invalid_request",
            schema_param,
        )
    other = RequestNotSupported("a sampling value the engine refuses", param="top_k")
    assert json.loads(_error_frame(other, "tools").removeprefix("data: "))["error"]["param"] == "top_k"


def test_a_forced_call_cut_by_max_tokens_comes_back_as_a_cut_tool_call(client: openai.OpenAI) -> None:
    """As OpenAI answers: the call with its arguments as far as they came, finish_reason length; it came back as
    the guided array's own text (`[{"name": "ge`) in content, a format the client never asked for."""
    named: ChatCompletionToolChoiceOptionParam = {"type": "function", "function": {"name": "get_weather"}}
    cut_arguments = []
    for max_tokens in (3, 40, 60):  # before the name is whole; in the arguments (seeded: this model at 80 ends)
        ask: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": named, "seed": 3}
        whole = client.chat.completions.create(**ask, max_tokens=max_tokens)
        choice = whole.choices[0]
        assert choice.finish_reason == "length"
        assert not choice.message.content, choice.message.content  # nothing of the guided array
        for call in choice.message.tool_calls or []:
            assert call.function.name == "get_weather"
            assert call.function.arguments.startswith("{"), call.function.arguments
            cut_arguments.append(call.function.arguments)
        text, arguments = "", ""
        for chunk in client.chat.completions.create(**ask, max_tokens=max_tokens, stream=True):
            for streamed in chunk.choices:
                text += streamed.delta.content or ""
                arguments += "".join(p.function.arguments or "" for p in streamed.delta.tool_calls or [] if p.function)
        assert text == ""
        assert arguments == "".join(c.function.arguments for c in choice.message.tool_calls or [])
    assert cut_arguments, "no answer was cut inside its arguments: the test shows nothing"
