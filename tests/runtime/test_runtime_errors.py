"""Every failure answers OpenAI-style JSON with the right status, never a bare 500."""

from __future__ import annotations

import httpx
import openai
import pytest

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
    assert huge.value.status_code == 413
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


def test_prompt_beyond_context_is_413(chat_server: InProcessServer) -> None:
    long_prompt = "quick brown fox " * 2000  # far more than the tiny model's 2048 positions
    response = httpx.post(
        chat_server.v1 + "/completions", json={"model": "tiny-llama", "prompt": long_prompt}, timeout=30
    )
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "context_length_exceeded"


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


def test_embedding_input_beyond_context_is_413(embed_server: InProcessServer) -> None:
    body = {"model": "minilm", "input": ["short", "word " * 1000]}  # MiniLM has 512 positions
    response = httpx.post(embed_server.v1 + "/embeddings", json=body, timeout=30)
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "context_length_exceeded"
    empty = httpx.post(embed_server.v1 + "/embeddings", json={"model": "minilm", "input": []}, timeout=30)
    assert empty.status_code == 400
    assert error_of(empty)["param"] == "input"
