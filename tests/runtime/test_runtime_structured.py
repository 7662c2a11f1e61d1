"""Structured outputs (`response_format`) on the transformers engine: guided decoding makes even the tiny
random model answer JSON that parses and validates against the schema. Helpers shared with vLLM's tests."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import InProcessServer
from tests.support.structured import (
    ASK,
    MODEL,
    check_greedy_json_is_compact,
    check_json_object_answer,
    check_json_schema_answer,
    check_unenforceable_schema_is_400,
)


@pytest.fixture
def client(chat_server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_json_schema_answers_parse_and_validate(client: openai.OpenAI) -> None:
    check_json_schema_answer(client)


def test_streamed_json_schema_answer_parses_and_validates(client: openai.OpenAI) -> None:
    check_json_schema_answer(client, stream=True)


def test_greedy_json_is_compact(client: openai.OpenAI) -> None:
    check_greedy_json_is_compact(client)


def test_json_object_answers_are_objects(client: openai.OpenAI) -> None:
    check_json_object_answer(client)


def test_text_format_is_plain_generation(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    text = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, temperature=0, response_format={"type": "text"}
    )
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_a_schema_guided_decoding_cannot_enforce_is_400(chat_server: InProcessServer) -> None:
    check_unenforceable_schema_is_400(chat_server.v1)


def _schema_body(schema: dict[str, Any], stream: bool, temperature: float) -> dict[str, Any]:
    response_format = {"type": "json_schema", "json_schema": {"name": "none", "schema": schema}}
    return {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 8,
        "temperature": temperature,
        "stream": stream,
        "response_format": response_format,
    }


# Compiled by xgrammar, matched by no value: every token is forbidden from the first one.
NOTHING_AT_ALL = [
    {"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/a"}}},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
]


@pytest.mark.parametrize("schema", NOTHING_AT_ALL, ids=["self", "mutual"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_schema_no_value_matches_is_400_before_anything_is_generated(
    chat_server: InProcessServer, schema: dict[str, Any], stream: bool, temperature: float
) -> None:
    """It was a 500 (sampling drew from NaN), a stream cut after its first chunk, or under greedy decoding a
    200 with tokens the schema does not allow."""
    body = _schema_body(schema, stream, temperature)
    response = httpx.post(chat_server.v1 + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format"
    assert "no value can match" in error["message"]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_schema_that_dead_ends_after_its_first_token_is_a_400_or_an_error_event(
    chat_server: InProcessServer, temperature: float
) -> None:
    """A string no text matches: the opening quote is allowed, then nothing. Found while generating: a whole
    answer is a 400, a stream ends with the 400's error event and [DONE], never cut."""
    schema = {"type": "string", "pattern": "[^\\s\\S]"}
    url = chat_server.v1 + "/chat/completions"
    whole = httpx.post(url, json=_schema_body(schema, False, temperature), timeout=60)
    assert whole.status_code == 400, whole.text
    assert whole.json()["error"]["param"] == "response_format"
    streamed = httpx.post(url, json=_schema_body(schema, True, temperature), timeout=60)
    assert streamed.status_code == 200, streamed.text
    events = [line.removeprefix("data: ") for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "[DONE]", streamed.text
    error = json.loads(events[-2])["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == ("invalid_request", "response_format")


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_of_tokens_the_grammar_rules_out_are_numbers(chat_server: InProcessServer, stream: bool) -> None:
    """Masked tokens have -inf, which JSON cannot carry: the answer was a 500 (a stream's logprob a null). As
    vLLM does, a logprob is at least -9999."""
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["zq"]}}},
        "stream": stream,
    }
    answer = httpx.post(f"{chat_server.v1}/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    if stream:
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
        entries = [e for ev in events for c in ev["choices"] for e in ((c.get("logprobs") or {}).get("content") or [])]
    else:
        entries = answer.json()["choices"][0]["logprobs"]["content"]
        openai.types.chat.ChatCompletion.model_validate(answer.json())
    values = [e["logprob"] for e in entries] + [t["logprob"] for e in entries for t in e["top_logprobs"]]
    assert values
    assert all(isinstance(v, float | int) and -9999 <= v <= 0 for v in values), values
    assert -9999 in values  # the grammar left fewer than 20 tokens possible at some step
