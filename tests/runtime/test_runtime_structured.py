"""Structured outputs (`response_format`) on the transformers engine: guided decoding makes even the tiny
random model answer JSON that parses and validates against the schema. Helpers shared with vLLM's tests."""

from __future__ import annotations

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
