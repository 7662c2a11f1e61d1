"""Every failure answers OpenAI-style JSON with the right status, never a bare 500."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import ValidationError

from servlane_core.protocol import openai as p
from tests.support.openai_errors import error_of
from tests.support.servers import InProcessServer


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny-llama", "messages": "hello"}, "messages"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}, "max_tokens"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"model": "tiny-llama", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "tiny-llama", "messages": []}, "messages"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ],
)
def test_bad_types_are_400(chat_server: InProcessServer, body: dict[str, object], param: str) -> None:
    response = httpx.post(chat_server.v1 + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert str(error["param"]).startswith(param)


def test_bad_requests_through_the_openai_client(chat_server: InProcessServer) -> None:
    client = openai.OpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="tiny-llama", messages=[])
    assert empty.value.param == "messages"
    assert empty.value.code == "invalid_request"
    with pytest.raises(openai.BadRequestError) as wrong_type:
        client.completions.create(model="tiny-llama", prompt=["fine", 3])  # type: ignore[arg-type]  # the wrong type is the test
    assert str(wrong_type.value.param).startswith("prompt")
    with pytest.raises(openai.APIStatusError) as huge:
        client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "quick brown fox " * 2000}], max_tokens=2
        )
    assert huge.value.status_code == 400
    assert huge.value.code == "context_length_exceeded"


def test_invalid_json_is_400(chat_server: InProcessServer) -> None:
    response = httpx.post(
        chat_server.v1 + "/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error_of(response)


def test_unknown_model_is_404(chat_server: InProcessServer, embed_server: InProcessServer) -> None:
    client = openai.OpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi")
    embed_client = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        embed_client.embeddings.create(model="tiny-llama", input="hi")


def test_prompt_beyond_context_is_400_naming_the_field(chat_server: InProcessServer) -> None:
    """OpenAI's and vLLM's status (the openai SDK's BadRequestError, which clients catch to shorten and retry)."""
    long_prompt = "quick brown fox " * 2000  # far more than the tiny model's 2048 positions
    response = httpx.post(
        chat_server.v1 + "/completions", json={"model": "tiny-llama", "prompt": long_prompt}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert (error_of(response)["code"], error_of(response)["param"]) == ("context_length_exceeded", "prompt")


def test_bad_priority_header_is_400(chat_server: InProcessServer) -> None:
    body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
    response = httpx.post(chat_server.v1 + "/completions", json=body, headers={"X-Priority": "urgent"}, timeout=30)
    assert response.status_code == 400
    assert error_of(response)["param"] == "X-Priority"


def test_unknown_path_is_404_json(chat_server: InProcessServer) -> None:
    response = httpx.get(chat_server.v1 + "/nothing-here")
    assert response.status_code == 404
    error_of(response)


def test_embeddings_on_a_generation_model_is_a_clean_error(chat_server: InProcessServer) -> None:
    response = httpx.post(chat_server.v1 + "/embeddings", json={"model": "tiny-llama", "input": "hi"}, timeout=30)
    assert response.status_code == 400
    assert "embed" in str(error_of(response)["message"])


def test_failures_are_counted_by_status(chat_server: InProcessServer) -> None:
    before = chat_server.metric("servlane_runtime_requests_total", 'code="404"')
    httpx.post(chat_server.v1 + "/completions", json={"model": "nope", "prompt": "x"}, timeout=30)
    assert chat_server.metric("servlane_runtime_requests_total", 'code="404"') == before + 1


def test_embedding_input_beyond_context_is_400(embed_server: InProcessServer) -> None:
    body = {"model": "minilm", "input": ["short", "word " * 1000]}  # MiniLM has 512 positions
    response = httpx.post(embed_server.v1 + "/embeddings", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert (error_of(response)["code"], error_of(response)["param"]) == ("context_length_exceeded", "input")
    empty = httpx.post(embed_server.v1 + "/embeddings", json={"model": "minilm", "input": []}, timeout=30)
    assert empty.status_code == 400
    assert error_of(empty)["param"] == "input"


def test_an_endpoint_the_model_is_not_loaded_for_is_a_400(
    chat_server: InProcessServer, embed_server: InProcessServer
) -> None:
    """Completions on an embedding model was the engine's own error, a 500 the openai SDK retries."""
    for stream in (False, True):
        body = {"model": "minilm", "prompt": "hi", "max_tokens": 2, "stream": stream}
        response = httpx.post(embed_server.v1 + "/completions", json=body, timeout=30)
        assert response.status_code == 400, response.text
        assert (error_of(response)["param"], error_of(response)["code"]) == ("model", "model_not_supported")
    chat = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(embed_server.v1 + "/chat/completions", json=chat, timeout=30).status_code == 400
    embed = httpx.post(chat_server.v1 + "/embeddings", json={"model": "tiny-llama", "input": "hi"}, timeout=30)
    assert error_of(embed)["code"] == "model_not_supported"


HI = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "top_logprobs"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ("/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
        ("/completions", {"prompt": []}, "prompt"),
        ("/chat/completions", {"messages": [{"role": "user"}]}, "messages.0.content"),
        ("/chat/completions", {"messages": [{"role": "user", "content": [IMAGE]}]}, "messages.0.content.0.type"),
        ("/chat/completions", {"messages": HI, "tool_choice": "always"}, "tool_choice"),
        ("/chat/completions", {"messages": [*HI, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
        ("/completions", {"prompt": "def f(", "suffix": "return 1"}, "suffix"),  # was ignored: no engine does FIM
    ],
    ids=["top_logprobs-alone", "stream_options-chat", "stream_options-completions", "empty-prompt", "no-content",
         "image-part", "bad-tool-choice", "tool-result-without-call-id", "suffix"],
)  # fmt: skip
def test_what_openai_and_vllm_refuse_is_a_400_naming_the_field(
    chat_server: InProcessServer, path: str, body: dict[str, Any], param: str
) -> None:
    """They were 200s (the option ignored), or 400s naming pydantic's union branch (`content.str`)."""
    response = httpx.post(chat_server.v1 + path, json={"model": "tiny-llama", "max_tokens": 2, **body}, timeout=30)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param


def test_only_an_assistant_message_may_leave_out_its_content() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert p.ChatMessage.model_validate({"role": "assistant", "tool_calls": [call]}).content is None
    for role in ("system", "developer", "user", "tool"):
        with pytest.raises(ValidationError, match=f"a {role} message needs content"):
            p.ChatMessage.model_validate({"role": role})


def test_the_body_counts_not_its_content_type_and_encoded_bodies_are_415(chat_server: InProcessServer) -> None:
    """A JSON body labelled text/plain (or curl -d's form type, or nothing) was a 400 about dictionaries at the
    runtime and a 200 at the gateway; a gzip body was "not valid JSON", and a plain one labelled br passed."""
    body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        served = httpx.post(chat_server.v1 + "/completions", content=body, headers=headers, timeout=30)
        assert served.status_code == 200, (content_type, served.text)
    for encoding, content in (("gzip", gzip.compress(body)), ("br", body)):
        headers = {"content-type": "application/json", "content-encoding": encoding}
        refused = httpx.post(chat_server.v1 + "/completions", content=content, headers=headers, timeout=30)
        assert refused.status_code == 415, refused.text
        assert error_of(refused)["code"] == "unsupported_content_encoding"
    identity = {"content-type": "application/json", "content-encoding": "identity"}
    assert httpx.post(chat_server.v1 + "/completions", content=body, headers=identity, timeout=30).status_code == 200
