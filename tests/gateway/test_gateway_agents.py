"""Agents through the gateway: tool calls and structured outputs as the `openai` SDK and LangChain send them,
answered by a real runtime (`python -m servlane_runtime`, transformers engine) behind a feature name.

The model is the tiny random Llama with the tool-capable template (tests/support/tool_model.py): it calls
tools and answers JSON only because guided decoding makes it, so every call and answer below must come back
whole and valid through the gateway, streamed deltas included. One runtime at a time, for each engine.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Iterator
from functools import partial, reduce
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from pydantic import BaseModel

from tests.support.gateway_harness import Gateway, StartGateway, aifeature, aimodel
from tests.support.polling import wait_until

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights at test time

from servlane_api.runtime_config import RuntimeConfig
from tests.support import tool_model
from tests.support.servers import SubprocessServer
from tests.support.structured import CITY_SCHEMA
from tests.support.tools import ASK, CLOCK, ROOM, TOOLS, WEATHER, assert_valid_calls, parameters_of
from tests.support.vllm import VLLM_START_SECONDS, require_vllm

pytestmark = pytest.mark.slow
tools_model_dir = tool_model.tools_model_dir

FEATURE = "agents"
SERVED = "tiny-tools"


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def runtime(request: pytest.FixtureRequest, tools_model_dir: Path) -> Iterator[SubprocessServer]:
    """One runtime at a time: every test runs against the transformers engine, then against vLLM's (its own
    guided decoding and tool parser), which is skipped without vLLM."""
    engine = request.param
    fields: dict[str, Any] = {}
    env: dict[str, str] = {}
    if engine == "vllm":
        require_vllm()
        # As in tests/runtime/test_runtime_tools_vllm.py: the tool-capable template takes ~750 tokens.
        fields = {"dtype": "bfloat16", "max_model_len": 2048, "extra_args": ["--enforce-eager"]}
        env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    config = RuntimeConfig(
        model_source=str(tools_model_dir),
        served_model_name=SERVED,
        engine=engine,
        max_in_flight=4,
        max_queue=16,
        queue_timeout_seconds=60,
        **fields,
    )
    with SubprocessServer(config, env) as server:
        server.wait_ready(timeout=VLLM_START_SECONDS if engine == "vllm" else 120)
        yield server


def objects(runtime: SubprocessServer, cached: bool = False) -> list[dict[str, Any]]:
    feature = aifeature(FEATURE, [("tools-model", 100)])
    if cached:
        feature["spec"]["responseCache"] = {"enabled": True}
    return [aimodel("tools-model", runtime.v1, served=SERVED), feature]


@pytest.fixture
def gateway(runtime: SubprocessServer, start_gateway: StartGateway) -> Gateway:
    return start_gateway(objects(runtime))


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return gateway.client(timeout=120)


# ---- the openai SDK ------------------------------------------------------------------------------------


def test_a_named_tool_is_called_with_valid_arguments(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=FEATURE,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=ROOM,
        n=2,
        seed=3,
    )
    assert reply.model == SERVED  # the runtime answered, through the feature
    assert_valid_calls(reply, {"get_time"}, at_most=1, finish="stop")


def test_required_makes_one_call_without_parallel_calls(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=FEATURE,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=ROOM,
        n=3,
        seed=5,
    )
    assert_valid_calls(reply, {"get_weather", "get_time"}, at_most=1)


def test_parallel_calls_come_back_whole_and_streamed_deltas_rebuild_them(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": FEATURE,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": ROOM,
        "n": 4,
        "seed": 11,
    }
    whole = client.chat.completions.create(**request)
    assert_valid_calls(whole, {"get_weather", "get_time"})
    expected = {
        choice.index: [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        for choice in whole.choices
    }
    # Over 4 seeded samples some answer makes several calls (as in the runtime's own tests): they survive
    # the relay.
    assert max(len(calls) for calls in expected.values()) >= 2, expected
    # The same request streamed (the gateway adds stream_options for its token count and cuts that chunk
    # out again): each choice's deltas rebuild its calls, in OpenAI's shape.
    names: dict[tuple[int, int], str] = {}
    arguments: dict[tuple[int, int], str] = {}
    finish: dict[int, str] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        assert chunk.usage is None
        for choice in chunk.choices:
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
            for piece in choice.delta.tool_calls or []:
                assert piece.function is not None
                key = (choice.index, piece.index)
                if key not in names:  # the first piece of a call: id, type and name
                    assert piece.id
                    assert piece.type == "function"
                    names[key] = piece.function.name or ""
                else:
                    assert piece.id is None
                arguments[key] = arguments.get(key, "") + (piece.function.arguments or "")
    assert finish == dict.fromkeys(expected, "tool_calls")
    rebuilt = {i: [(names[k], arguments[k]) for k in sorted(names) if k[0] == i] for i in expected}
    assert rebuilt == expected


def test_a_json_schema_answer_parses_and_validates(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=FEATURE,
        messages=[{"role": "user", "content": "Describe a city as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}},
        max_tokens=300,
        n=2,
        seed=2,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), CITY_SCHEMA)


def test_the_runtimes_400s_reach_the_client(client: openai.OpenAI) -> None:
    bad_schema: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=FEATURE,
            messages=ASK,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad_schema}},
            max_tokens=4,
        )
    assert (refused.value.param, refused.value.code) == ("response_format", "invalid_schema")
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model=FEATURE, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
        )
    assert unknown.value.param == "tool_choice"


def cached_answers(gw: Gateway, count: int) -> bool:
    return gw.sample("servlane_gateway_response_cache_stores_total", feature=FEATURE) >= count


def test_the_response_cache_keys_on_the_schema_and_never_keeps_tool_calls(
    runtime: SubprocessServer, start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(runtime, cached=True))
    url = gw.url + "/v1/chat/completions"
    base = {"model": FEATURE, "messages": ASK, "max_tokens": 300, "temperature": 0}
    city = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    first = httpx.post(url, json={**base, "response_format": city}, timeout=120)
    assert first.status_code == 200, first.text
    assert first.headers["x-servlane-cache"] == "miss"
    wait_until("the answer kept", partial(cached_answers, gw, 1), 10)
    again = httpx.post(url, json={**base, "response_format": city}, timeout=120)
    assert again.headers["x-servlane-cache"] == "hit"
    assert again.content == first.content
    # Another schema is another request: never the first schema's answer (which this one would refuse).
    sizes = {"type": "string", "enum": ["tiny", "huge"]}
    other_schema = {**CITY_SCHEMA, "properties": {**CITY_SCHEMA["properties"], "size": sizes}}
    other = {"type": "json_schema", "json_schema": {"name": "city", "schema": other_schema}}
    second = httpx.post(url, json={**base, "response_format": other}, timeout=120)
    assert second.headers["x-servlane-cache"] == "miss"
    jsonschema.validate(json.loads(second.json()["choices"][0]["message"]["content"]), other_schema)
    # Tool calls: the caller runs them, so the cache stays out of it, even of a seeded request (which it
    # would keep otherwise). Sampled: the greedy tiny model repeats its first call until max_tokens.
    calls = {
        "model": FEATURE,
        "messages": ASK,
        "max_tokens": ROOM,
        "seed": 11,
        "tools": TOOLS,
        "tool_choice": "required",
    }
    for _ in range(2):
        tools = httpx.post(url, json=calls, timeout=120)
        assert tools.status_code == 200, tools.text
        assert "x-servlane-cache" not in tools.headers
        assert tools.json()["choices"][0]["message"]["tool_calls"]


# ---- LangChain -----------------------------------------------------------------------------------------


def chat_model(gw: Gateway, **fields: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{gw.url}/v1", api_key="unused", model=FEATURE, max_retries=0, timeout=120, **fields)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["get_weather", "required"])
def test_langchain_bind_tools_gets_parsed_tool_calls(gateway: Gateway, tool_choice: str, stream: bool) -> None:
    model = chat_model(gateway, max_tokens=ROOM, seed=5)
    bound = model.bind_tools([WEATHER, CLOCK], tool_choice=tool_choice, parallel_tool_calls=False)
    ask = "What is the weather in Paris?"
    # Streamed, LangChain adds up the tool-call chunks, then parses the arguments.
    message = reduce(operator.add, bound.stream(ask)) if stream else bound.invoke(ask)
    assert len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    expected = {"get_weather"} if tool_choice == "get_weather" else {"get_weather", "get_time"}
    assert call["name"] in expected
    assert call["id"].startswith("call_")
    jsonschema.validate(call["args"], parameters_of(call["name"]))
    assert not message.invalid_tool_calls


class City(BaseModel):
    name: Literal["Paris", "Rome", "Oslo"]
    capital: bool
    size: Literal["small", "large"]


def test_langchain_structured_output_is_a_validated_object(gateway: Gateway) -> None:
    model = chat_model(gateway, max_tokens=300, seed=2)
    answer = model.with_structured_output(City, method="json_schema", include_raw=True).invoke("Describe a city.")
    assert answer["parsing_error"] is None
    city = answer["parsed"]
    assert isinstance(city, City)
    # Answered as response_format json_schema (guided decoding), not through a tool call.
    raw = answer["raw"]
    assert not raw.tool_calls
    assert City.model_validate_json(raw.content) == city
