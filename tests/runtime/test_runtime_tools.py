"""Tool calling on the transformers engine, through the official `openai` client.

The model is the tiny random Llama with a tool-capable template (tests/support/tool_model.py): it never
calls a tool by itself, so `required` and a named function must come from guided decoding, and every call
it returns must validate against its tool's parameters. The helpers are shared with the vLLM engine's tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

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
