"""The OpenAI surface on the transformers and llama.cpp engines, through the official `openai` client: every test
runs on each (the llama.cpp one serves the same models converted to GGUF)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.polling import wait_until
from tests.support.servers import InProcessServer
from tests.support.sse import sse_lines

MODEL = "tiny-llama"
ENGINES = ["transformers", "llamacpp"]


@pytest.fixture(params=ENGINES)
def chat_server(request: pytest.FixtureRequest, chat_server: InProcessServer) -> InProcessServer:
    return chat_server if request.param == "transformers" else request.getfixturevalue("llamacpp_chat_server")


@pytest.fixture(params=ENGINES)
def embed_server(request: pytest.FixtureRequest, embed_server: InProcessServer) -> InProcessServer:
    return embed_server if request.param == "transformers" else request.getfixturevalue("llamacpp_embed_server")


@pytest.fixture
def client(chat_server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL  # it was a 404, as for any unknown path
    with pytest.raises(openai.NotFoundError) as unknown:
        client.models.retrieve("no-such-model")
    assert unknown.value.code == "model_not_found"


def test_chat_completion_honours_max_tokens_and_reports_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=5, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 5
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # A random tiny model rarely says </s>: 5 tokens means "length", fewer means it stopped by itself.
    assert choice.finish_reason == ("length" if reply.usage.completion_tokens == 5 else "stop")


def test_greedy_is_deterministic_and_seed_reproduces_sampling(client: openai.OpenAI) -> None:
    def say(**kw: object) -> str:
        reply = client.completions.create(model=MODEL, prompt="The quick brown", max_tokens=8, **kw)  # type: ignore[call-overload]
        return str(reply.choices[0].text)

    assert say(temperature=0) == say(temperature=0)
    assert say(temperature=1.0, seed=7) == say(temperature=1.0, seed=7)
    samples = {say(temperature=2.0, seed=s) for s in range(4)}
    assert len(samples) > 1, "different seeds at temperature 2 should not all agree"


def test_max_completion_tokens_and_n(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=3, n=2, seed=1
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 6


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0)
    text = free.choices[0].text
    visible = text.replace("\ufffd", "")
    if len(visible) < 3:
        pytest.fail(f"greedy output too short to pick a stop string from: {text!r}")
    stop = visible[1:3]
    cut = client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)


def test_completion_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Paris", max_tokens=4, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert lp is not None
    assert lp.token_logprobs is not None
    assert lp.top_logprobs is not None
    assert len(lp.token_logprobs) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for value, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0
        assert len(top) == 2
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(value, max(top.values()), abs_tol=1e-4)


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert 1 <= usage.completion_tokens <= 6
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0
    )
    assert text == whole.choices[0].message.content


def test_completion_stream_ends_with_done(chat_server: InProcessServer) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", chat_server.v1 + "/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in sse_lines(response) if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 2


def test_echo_begins_each_choice_with_its_prompt_whole_and_streamed(
    client: openai.OpenAI, chat_server: InProcessServer
) -> None:
    """`echo` was accepted and ignored: the answer lacked the prompt that OpenAI and vLLM put first."""
    prompts = ["The quick brown", "Once upon"]
    plain = client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, temperature=0, n=2)
    echoed = client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, temperature=0, n=2, echo=True)
    assert [c.text for c in echoed.choices] == [prompts[i // 2] + c.text for i, c in enumerate(plain.choices)]
    assert echoed.usage is not None
    assert plain.usage is not None
    assert (echoed.usage.prompt_tokens, echoed.usage.completion_tokens) == (
        plain.usage.prompt_tokens,
        plain.usage.completion_tokens,
    )  # the echo is not generated: the same counts (cached ones vary with llama.cpp's prefix cache)
    streamed = [""] * 4
    for chunk in client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=3, temperature=0, n=2, echo=True, stream=True
    ):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [c.text for c in echoed.choices]
    # The echoed prompt's logprobs are not computed here: refused, not left out.
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "echo": True, "logprobs": 1}
    refused = httpx.post(chat_server.v1 + "/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "echo"


def test_a_completion_without_max_tokens_is_16_tokens_at_most(client: openai.OpenAI) -> None:
    """OpenAI's and vLLM's default for /v1/completions; it generated up to the whole context (2044 tokens)."""
    answer = client.completions.create(
        model=MODEL, prompt="The quick brown", temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 16
    assert answer.choices[0].finish_reason == "length"


def test_unknown_fields_are_ignored(chat_server: InProcessServer) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "some_future_field": {"x": 1}}
    response = httpx.post(chat_server.v1 + "/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text


def test_embeddings_are_normalised_and_meaningful(embed_server: InProcessServer) -> None:
    client = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0)
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Quarterly tax filing deadlines."]
    result = client.embeddings.create(model="minilm", input=texts)
    vectors = [d.embedding for d in result.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    for v in vectors:
        assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4)

    def cos(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2]) + 0.2
    assert result.usage.prompt_tokens > len(texts)


def test_eight_concurrent_streams_complete_with_usage(chat_server: InProcessServer) -> None:
    """8 streams at once (4 run, 4 queue): each completes with its own text and exact usage."""
    prompts = [f"Stream number {i}" for i in range(8)]
    sync = openai.OpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0, timeout=60)
    expected = [
        sync.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": p}],
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        for p in prompts
    ]

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int, int]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        assert usage is not None
        return text, usage.prompt_tokens, usage.completion_tokens

    async def all_of_them() -> list[tuple[str, int, int]]:
        client = openai.AsyncOpenAI(base_url=chat_server.v1, api_key="unused", max_retries=0, timeout=60)
        async with client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(all_of_them())
    for (text, prompt_tokens, completion_tokens), reference in zip(results, expected, strict=True):
        assert reference.usage is not None
        assert text == reference.choices[0].message.content
        assert (prompt_tokens, completion_tokens) == (reference.usage.prompt_tokens, 6)
    wait_until("no request in flight", lambda: chat_server.metric("servlane_runtime_in_flight") == 0, 30)


def test_client_leaving_stops_the_generation(client: openai.OpenAI, chat_server: InProcessServer) -> None:
    """A stream closed after its first chunk, and a plain request given up on, both stop the engine."""
    long = 2000  # tokens: many seconds of generation on this model
    before = chat_server.metric("servlane_runtime_tokens_total", 'kind="completion"')
    stream = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=long, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    stream.close()
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": long, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(chat_server.v1 + "/completions", json=body, timeout=1.0)
    wait_until("both slots to be freed", lambda: chat_server.metric("servlane_runtime_in_flight") == 0, 30)
    generated = chat_server.metric("servlane_runtime_tokens_total", 'kind="completion"') - before
    assert 1 <= generated < long, "the abandoned requests should have stopped generating"


def test_logit_bias_moves_the_tokens_it_names(client: openai.OpenAI, chat_server: InProcessServer) -> None:
    """OpenAI's logit_bias was accepted and ignored. +100 on one token makes greedy decoding take it every time,
    with logprobs (the logits path) and without (llama.cpp's own sampler chain otherwise)."""
    picked = {}
    for token in (42, 43):
        ask: dict[str, Any] = {"model": MODEL, "prompt": "The quick brown", "max_tokens": 4, "temperature": 0}
        with_logprobs = client.completions.create(**ask, logprobs=1, logit_bias={str(token): 100})
        logprobs = with_logprobs.choices[0].logprobs
        assert logprobs is not None
        assert logprobs.tokens is not None
        assert len(set(logprobs.tokens)) == 1, logprobs.tokens  # the biased token, four times
        plain = client.completions.create(**ask, logit_bias={str(token): 100})
        assert plain.choices[0].text == with_logprobs.choices[0].text
        picked[token] = logprobs.tokens[0]
    assert picked[42] != picked[43]
    for bias, param_says in (({"999999": 5}, "vocabulary"), ({"abc": 5}, "token ids"), ({"42": 101}, "-100 and 100")):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "logit_bias": bias}
        refused = httpx.post(chat_server.v1 + "/completions", json=body, timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"].startswith("logit_bias")
        assert param_says in refused.json()["error"]["message"]


def test_a_prompt_of_token_ids_is_read_as_those_tokens(client: openai.OpenAI, chat_server: InProcessServer) -> None:
    """OpenAI and vLLM take `prompt` as token ids too (one prompt, or several): it was a 400."""
    one = client.completions.create(model=MODEL, prompt=[1, 45, 99, 173], max_tokens=2, temperature=0)
    assert one.usage is not None
    assert one.usage.prompt_tokens == 4
    several = client.completions.create(model=MODEL, prompt=[[1, 45], [1, 45, 99]], max_tokens=2, temperature=0)
    assert several.usage is not None
    assert (len(several.choices), several.usage.prompt_tokens) == (2, 5)
    for prompt in ([999999], [[1], []], [-1]):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        refused = httpx.post(chat_server.v1 + "/completions", json=body, timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"].startswith("prompt")


def test_embeddings_take_token_ids_as_openai_and_vllm_do(embed_server: InProcessServer, minilm_model_dir: Path) -> None:
    """Input as token ids (one list, or several), taken as they are: the vectors of a text's own ids are the
    text's. It was a 400 'Input should be a valid string'."""
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0)
    texts = ["A cat sits on the mat.", "Quarterly tax filing deadlines."]
    ids = [list(AutoTokenizer.from_pretrained(minilm_model_dir)(text)["input_ids"]) for text in texts]
    by_text = client.embeddings.create(model="minilm", input=texts)
    by_ids = client.embeddings.create(model="minilm", input=ids)
    one = client.embeddings.create(model="minilm", input=ids[1])
    assert by_ids.usage.prompt_tokens == sum(len(x) for x in ids) == by_text.usage.prompt_tokens
    assert one.usage.prompt_tokens == len(ids[1])
    for mine, theirs in zip(by_ids.data + one.data, by_text.data + by_text.data[1:], strict=True):
        assert sum(a * b for a, b in zip(mine.embedding, theirs.embedding, strict=True)) > 0.9999


@pytest.mark.parametrize(
    ("given", "param"),
    [([30522], "input"), ([[101, 102], [101, 10**6]], "input"), ([], "input"), ("", "input"), (["hi", ""], "input"),
     ([[]], "input"), ([-1], "input"), ([[1, 2], "hi"], "input")],
    ids=["id-past-the-vocabulary", "one-of-several-past-it", "no-input", "empty-text", "an-empty-text-of-several",
         "empty-ids", "negative-id", "ids-and-text-mixed"],
)  # fmt: skip
def test_embeddings_refuse_input_no_model_could_embed(embed_server: InProcessServer, given: Any, param: str) -> None:
    response = httpx.post(embed_server.v1 + "/embeddings", json={"model": "minilm", "input": given}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].split(".")[0] == param


def test_many_inputs_come_back_in_order_each_its_own_vector_and_past_2048_are_refused(
    embed_server: InProcessServer,
) -> None:
    """A request's inputs are embedded a few at a time (a request of 2048 long inputs at once held every
    activation of all); each vector is its input's, in order, across those batches. More than OpenAI's 2048
    inputs is a 400."""
    client = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0, timeout=120)
    texts = [f"Sentence number {i} is about {'cats' if i % 2 else 'taxes'} and the number {i * 7}." for i in range(70)]
    many = client.embeddings.create(model="minilm", input=texts)
    assert [d.index for d in many.data] == list(range(len(texts)))
    for i in (0, 31, 32, 33, 64, 69):  # either side of a batch's edge
        alone = client.embeddings.create(model="minilm", input=texts[i]).data[0].embedding
        assert sum(a * b for a, b in zip(many.data[i].embedding, alone, strict=True)) > 0.9999, i
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="minilm", input=["hi"] * 2049)
    assert refused.value.param == "input"


def test_ids_from_another_vocabulary_are_refused_saying_where_they_usually_come_from(
    embed_server: InProcessServer,
) -> None:
    """LangChain's OpenAIEmbeddings sends ids of OpenAI's tokenizer (cl100k: up to 100,276) unless told not to;
    past this model's vocabulary they are refused, saying how to send text instead."""
    client = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="minilm", input=[[32, 8415, 374, 389, 279, 5634, 13, 100256]])
    assert refused.value.param == "input"
    assert "check_embedding_ctx_length=False" in refused.value.message


def test_embeddings_take_their_own_dimensions_and_refuse_others(embed_server: InProcessServer) -> None:
    """`dimensions` was dropped: a vector store asking for 8 got 384 floats. No model here is trained to be cut
    (Matryoshka), so only its own size is served."""
    url = embed_server.v1 + "/embeddings"
    native = len(httpx.post(url, json={"model": "minilm", "input": "hi"}, timeout=30).json()["data"][0]["embedding"])
    same = httpx.post(url, json={"model": "minilm", "input": "hi", "dimensions": native}, timeout=30)
    assert same.status_code == 200, same.text
    for dimensions in (8, 0):
        refused = httpx.post(url, json={"model": "minilm", "input": "hi", "dimensions": dimensions}, timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_a_logit_bias_key_that_is_no_ascii_number_is_a_400(chat_server: InProcessServer, path: str) -> None:
    """'²'.isdigit() is true and int('²') fails: such a key was a 500."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "logit_bias": {"\u00b2": 5}}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if path.startswith("chat") else {"prompt": "Hi"})
    answer = httpx.post(f"{chat_server.v1}/{path}", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "logit_bias"


NULL_TAKES_THE_DEFAULT = {
    "chat/completions": ["n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "parallel_tool_calls"],
    "completions": ["n", "stream", "presence_penalty", "frequency_penalty", "echo", "ignore_eos"],
}


@pytest.mark.parametrize(
    ("path", "field"), [(path, field) for path, fields in NULL_TAKES_THE_DEFAULT.items() for field in fields]
)
def test_null_is_the_default_of_an_optional_field(chat_server: InProcessServer, path: str, field: str) -> None:
    """OpenAI's reference takes null for each (as vLLM's Optional fields do); `"n": null` was a 400."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "temperature": 0, field: None}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if path.startswith("chat") else {"prompt": "Hi"})
    answer = httpx.post(f"{chat_server.v1}/{path}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"]) == 1  # n's default
    schema = httpx.get(chat_server.base_url + "/openapi.json", timeout=10).json()
    name = "ChatCompletionRequest" if path.startswith("chat") else "CompletionRequest"
    assert {"type": "null"} in schema["components"]["schemas"][name]["properties"][field]["anyOf"]
    missing = {k: v for k, v in body.items() if k != "model"}  # a required field takes no null
    assert httpx.post(f"{chat_server.v1}/{path}", json={**missing, "model": None}, timeout=60).status_code == 400


def test_a_streamed_completions_text_offsets_count_from_the_start_of_its_text(chat_server: InProcessServer) -> None:
    """They started at 0 in every chunk; vLLM counts on from the text sent before."""
    ask = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    whole = httpx.post(f"{chat_server.v1}/completions", json={**ask, "ignore_eos": True}, timeout=60).json()
    expected = whole["choices"][0]["logprobs"]
    tokens, offsets = [], []
    with httpx.stream(
        "POST", f"{chat_server.v1}/completions", json={**ask, "ignore_eos": True, "stream": True}, timeout=60
    ) as streamed:
        events = [json.loads(line[6:]) for line in sse_lines(streamed) if line.startswith("data: {")]
        for event in events:
            for choice in event["choices"]:
                if choice.get("logprobs"):
                    tokens += choice["logprobs"]["tokens"]
                    offsets += choice["logprobs"]["text_offset"]
    assert tokens == expected["tokens"]
    assert offsets == expected["text_offset"]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert len(set(offsets)) > 1
