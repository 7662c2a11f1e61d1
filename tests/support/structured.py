"""Structured-output checks (JSON schema, JSON object, compact greedy JSON) that any OpenAI base URL serving the
tiny Llama passes: the transformers engine, the vLLM engine and the gateway run the same ones."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
from openai.types.chat import ChatCompletionMessageParam

MODEL = "tiny-llama"
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Describe a city as JSON."}]


CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "capital": {"type": "boolean"},
        "size": {"type": "string", "enum": ["small", "large"]},
    },
    "required": ["name", "capital", "size"],
    "additionalProperties": False,
}


ROOM = 300


def check_json_schema_answer(client: openai.OpenAI, *, stream: bool = False) -> None:
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    if stream:
        text = ""
        for chunk in client.chat.completions.create(
            model=MODEL, messages=ASK, response_format=response_format, max_tokens=ROOM, seed=2, stream=True
        ):
            for choice in chunk.choices:
                assert not choice.delta.tool_calls
                text += choice.delta.content or ""
        answers = [text]
    else:
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, response_format=response_format, max_tokens=ROOM, n=3, seed=2
        )
        assert all(c.finish_reason == "stop" for c in reply.choices)
        answers = [c.message.content or "" for c in reply.choices]
    for answer in answers:
        jsonschema.validate(json.loads(answer), CITY_SCHEMA)


def check_json_object_answer(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format={"type": "json_object"}, max_tokens=ROOM, n=2, seed=4
    )
    for choice in reply.choices:
        if choice.finish_reason == "length":  # any object may go on: only a finished one must parse
            continue
        assert isinstance(json.loads(choice.message.content or ""), dict)


def check_greedy_json_is_compact(client: openai.OpenAI) -> None:
    """Greedy, the random model's likeliest token is often whitespace: allowed anywhere between JSON tokens,
    it would pad until max_tokens. Guided decoding allows none (only `, ` and `: `), so the answer ends, and
    reads as json.dumps writes it, on either engine."""
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    questions: list[str] = ["Describe a city as JSON.", "Another city?", "What is the weather in Paris?"]
    for question in questions:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, response_format=response_format, max_tokens=ROOM, temperature=0
        )
        answer = reply.choices[0].message.content or ""
        assert reply.choices[0].finish_reason == "stop", answer
        parsed = json.loads(answer)
        jsonschema.validate(parsed, CITY_SCHEMA)
        assert answer == json.dumps(parsed)


def check_unenforceable_schema_is_400(base_url: str) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}},
    }
    for stream in (False, True):
        response = httpx.post(base_url + "/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "response_format"
