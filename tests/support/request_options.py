"""Every request option the runtime accepts, checked by behaviour through the official `openai` client, against
any base URL serving the tiny Llama with the tool-capable template (tests/support/tool_model.py) as
`tiny-llama`: in a process (tests/runtime) or in a real pod (e2e/test_real_pods_vllm.py).

The weights are random: a token may decode to nothing printable, so what a check compares is token counts,
finish reasons, choice indexes, logprobs (tokens and values) and parsed JSON, never a text written here. Each
sampled request carries `ignore_eos` where a count is asserted, so the model cannot end early by chance.
Tools and JSON modes reuse the engine tests' own checks (tests/runtime/test_runtime_tools.py,
tests/runtime/test_runtime_structured.py); `check_every_option` runs them all.

Not here because the runtime does not take them (its request models ignore unknown fields, as OpenAI-style
servers do): vLLM's `top_k`, `min_p` and `repetition_penalty`.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
from openai import Stream
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob
from pydantic import ValidationError

from servlane_core.protocol import openai as p
from tests.support.structured import (
    check_greedy_json_is_compact,
    check_json_object_answer,
    check_json_schema_answer,
    check_unenforceable_schema_is_400,
)
from tests.support.tools import (
    ASK,
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

MODEL = "tiny-llama"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello, who are you?"}]
PROMPT = "Paris is"
TOKENS = 12
# Generation past the end-of-sequence token: counts can be asserted exactly.
NO_EOS = {"ignore_eos": True}
# Hot enough that differently seeded samples of the random model part within a few tokens.
HOT_TEMPERATURE, HOT_TOP_P = 1.5, 0.95
HOT = {"temperature": HOT_TEMPERATURE, "top_p": HOT_TOP_P}


def chat(client: openai.OpenAI, **fields: Any) -> ChatCompletion:
    request: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": TOKENS, **fields}
    reply: ChatCompletion = client.chat.completions.create(**request)
    return reply


def chat_stream(client: openai.OpenAI, **fields: Any) -> Stream[ChatCompletionChunk]:
    request: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": TOKENS, **fields}
    stream: Stream[ChatCompletionChunk] = client.chat.completions.create(stream=True, **request)
    return stream


def tokens_of(reply: ChatCompletion, index: int = 0) -> list[tuple[str, float]]:
    """The generated tokens of one choice with their logprobs (the request must ask for logprobs)."""
    logprobs = reply.choices[index].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    return [(t.token, t.logprob) for t in logprobs.content]


def same_tokens(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    """The same tokens with the same logprobs (to float noise): the same generation."""
    return len(a) == len(b) and all(
        x == y and math.isclose(u, v, abs_tol=1e-3) for (x, u), (y, v) in zip(a, b, strict=True)
    )


def check_usage(reply: Any, completion_tokens: int | None = None) -> None:
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    if completion_tokens is not None:
        assert reply.usage.completion_tokens == completion_tokens, reply.usage


# ---- sampling ----------------------------------------------------------------------------------------------


def check_greedy_is_deterministic(client: openai.OpenAI) -> None:
    first, again = (chat(client, temperature=0, logprobs=True, **{"extra_body": NO_EOS}) for _ in range(2))
    check_usage(first, TOKENS)
    assert first.choices[0].finish_reason == "length"
    assert first.choices[0].message.content == again.choices[0].message.content
    assert same_tokens(tokens_of(first), tokens_of(again))


def check_seeds(client: openai.OpenAI) -> None:
    """Hot sampling: the same seed gives the same tokens; other seeds give other tokens."""
    ask = {"logprobs": True, "extra_body": NO_EOS, **HOT}
    first, again = (chat(client, seed=42, **ask) for _ in range(2))
    assert same_tokens(tokens_of(first), tokens_of(again))
    assert first.choices[0].message.content == again.choices[0].message.content
    others = [tokens_of(chat(client, seed=seed, **ask)) for seed in (1, 2, 3)]
    assert any(not same_tokens(tokens_of(first), other) for other in others), "seeds change nothing"
    # The same on completions.
    one, two = (
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=TOKENS,
            seed=7,
            temperature=HOT_TEMPERATURE,
            top_p=HOT_TOP_P,
            extra_body=NO_EOS,
        )
        for _ in range(2)
    )
    assert one.choices[0].text == two.choices[0].text
    check_usage(one, TOKENS)


def likeliest_each_time(reply: ChatCompletion) -> bool:
    """Whether every generated token was a likeliest one at its place (its logprob is the top alternative's).

    Compared per token, not with a greedy text: the random model's distribution is nearly flat, so two tokens
    can tie, and two code paths (greedy, sampling) may break the tie differently."""
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    return all(math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-4) for t in logprobs.content)


def check_top_p_and_temperature(client: openai.OpenAI) -> None:
    """Hot sampling picks tokens that are not the likeliest; a top_p so small that only the likeliest token is
    left picks the likeliest each time. The smallest positive temperature (a 500 once, found by fuzzing) is
    served (vLLM raises any temperature below 0.01 to 0.01: nearly, not exactly, greedy)."""
    ask: dict[str, Any] = {"logprobs": True, "top_logprobs": 2, "max_tokens": 24, "extra_body": NO_EOS}
    for seed in (1, 2):
        hot = chat(client, temperature=2.0, seed=seed, **ask)
        check_usage(hot, 24)
        assert not likeliest_each_time(hot), "hot sampling took the likeliest token every time: this checks nothing"
        assert likeliest_each_time(chat(client, temperature=1.0, top_p=1e-9, seed=seed, **ask))
        check_usage(chat(client, temperature=5e-324, seed=seed, **ask), 24)
    assert likeliest_each_time(chat(client, temperature=0, **ask))


def check_penalties(client: openai.OpenAI) -> None:
    """Greedy, the random model repeats itself; presence and frequency penalties push it to tokens it has not
    used yet, so it repeats less, and each penalty on its own changes the generation."""
    length = 48
    ask: dict[str, Any] = {"temperature": 0, "max_tokens": length, "logprobs": True, "extra_body": NO_EOS}
    plain = [t for t, _ in tokens_of(chat(client, **ask))]
    presence = [t for t, _ in tokens_of(chat(client, presence_penalty=2.0, **ask))]
    frequency = [t for t, _ in tokens_of(chat(client, frequency_penalty=2.0, **ask))]
    both = [t for t, _ in tokens_of(chat(client, presence_penalty=2.0, frequency_penalty=2.0, **ask))]
    assert len(plain) == len(presence) == len(frequency) == len(both) == length
    assert len(set(plain)) < length, "greedy never repeats a token: the penalties check nothing"
    assert presence != plain
    assert frequency != plain
    assert len(set(both)) > len(set(plain)), (plain, both)
    # A negative penalty rewards repetition: fewer distinct tokens than with the positive ones.
    sticky = [t for t, _ in tokens_of(chat(client, presence_penalty=-2.0, frequency_penalty=-2.0, **ask))]
    assert len(set(sticky)) < len(set(both)), (sticky, both)


def check_max_completion_tokens(client: openai.OpenAI) -> None:
    reply = chat(client, max_tokens=None, max_completion_tokens=5, temperature=0, extra_body=NO_EOS)
    check_usage(reply, 5)
    assert reply.choices[0].finish_reason == "length"


# ---- logprobs ----------------------------------------------------------------------------------------------


def check_chat_logprobs(client: openai.OpenAI) -> None:
    """One entry per generated token, each with exactly top_logprobs alternatives, likeliest first; greedy, the
    chosen token is the likeliest."""
    for temperature in (0, 1.0):
        reply = chat(client, temperature=temperature, seed=5, logprobs=True, top_logprobs=3, extra_body=NO_EOS)
        check_usage(reply, TOKENS)
        logprobs = reply.choices[0].logprobs
        assert logprobs is not None
        assert logprobs.content is not None
        entries: list[ChatCompletionTokenLogprob] = logprobs.content
        assert len(entries) == TOKENS
        for entry in entries:
            assert entry.logprob <= 0
            values = [alt.logprob for alt in entry.top_logprobs]
            assert len(values) == 3
            assert values == sorted(values, reverse=True)
            assert all(v <= 0 for v in values)
            if temperature == 0:
                assert math.isclose(entry.logprob, values[0], abs_tol=1e-4)
            else:
                assert entry.logprob <= values[0] + 1e-4
    plain = chat(client, temperature=0)
    assert plain.choices[0].logprobs is None  # only when asked


def check_completion_logprobs(client: openai.OpenAI) -> None:
    """Legacy `logprobs: 2`: the two likeliest and the sampled token (three entries when it is not among them)."""
    reply = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=TOKENS, temperature=2.0, seed=7, logprobs=2, extra_body=NO_EOS
    )
    check_usage(reply, TOKENS)
    lp = reply.choices[0].logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert lp.token_logprobs is not None
    assert lp.top_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == TOKENS
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0
        assert token in top
        # Keyed by text, and two tokens may share one (the random model writes many partial UTF-8 bytes as ''):
        # then the likelier one's value stands, and an entry less.
        assert 1 <= len(top) <= 3
        assert top[token] >= value - 1e-4
    # So hot, the sampled token is mostly not among the two likeliest: three entries.
    assert any(len(top) == 3 for top in lp.top_logprobs), lp.top_logprobs


# ---- stop strings, n, streaming ----------------------------------------------------------------------------


def stop_string_from(text: str) -> str | None:
    """Two neighbouring characters of the text after its first, neither U+FFFD (what vLLM's detokenizer writes
    for bytes that are not UTF-8 yet, which a stop string can never meet); None when there are none."""
    for start in range(1, len(text) - 1):
        pair = text[start : start + 2]
        if "\ufffd" not in pair:
            return pair
    return None


def check_stop_strings(client: openai.OpenAI) -> None:
    """A stop string taken from the greedy text ends the same greedy generation there, without it, with
    finish_reason stop; on completions, chat, and chat streamed."""
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=NO_EOS)
    stop = stop_string_from(free.choices[0].text)
    assert stop is not None, f"greedy output has no two neighbouring characters to stop at: {free.choices[0].text!r}"
    cut = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "never-seen"], extra_body=NO_EOS
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert free.choices[0].text.startswith(cut.choices[0].text)
    assert cut.usage is not None
    assert cut.usage.completion_tokens < 24

    whole = chat(client, temperature=0, max_tokens=24, extra_body=NO_EOS).choices[0].message.content or ""
    stop = stop_string_from(whole)
    assert stop is not None, f"greedy chat has no two neighbouring characters to stop at: {whole!r}"
    cut_chat = chat(client, temperature=0, max_tokens=24, stop=stop, extra_body=NO_EOS).choices[0]
    assert cut_chat.finish_reason == "stop"
    assert whole.startswith(cut_chat.message.content or "")
    assert stop not in (cut_chat.message.content or "")
    text, finish = "", None
    for chunk in chat_stream(client, temperature=0, max_tokens=24, stop=[stop], extra_body=NO_EOS):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "stop"
    assert text == cut_chat.message.content


def check_n(client: openai.OpenAI) -> None:
    """n seeded hot samples: n choices indexed 0..n-1, each of max_tokens, counted together in usage, not all
    alike; the same seed again gives the same n samples."""
    ask: dict[str, Any] = {"n": 3, "seed": 9, "logprobs": True, "extra_body": NO_EOS, **HOT}
    reply, again = chat(client, **ask), chat(client, **ask)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.finish_reason for c in reply.choices] == ["length"] * 3
    check_usage(reply, 3 * TOKENS)
    samples = [tokens_of(reply, i) for i in range(3)]
    assert all(len(s) == TOKENS for s in samples)
    assert not same_tokens(samples[0], samples[1]) or not same_tokens(samples[1], samples[2]), "n alike"
    assert all(same_tokens(a, tokens_of(again, i)) for i, a in enumerate(samples))
    # Completions: n per prompt, for each of two prompts.
    completions = client.completions.create(
        model=MODEL,
        prompt=[PROMPT, "The quick brown fox"],
        n=2,
        max_tokens=4,
        seed=9,
        temperature=HOT_TEMPERATURE,
        top_p=HOT_TOP_P,
        extra_body=NO_EOS,
    )
    assert [c.index for c in completions.choices] == [0, 1, 2, 3]
    check_usage(completions, 4 * 4)


def check_streams(client: openai.OpenAI) -> None:
    """Streamed chat and completions, n=2, with include_usage: each choice streams to its own finish reason, the
    usage chunk comes last and counts every token; the text is the unstreamed answer's, same seed."""
    ask: dict[str, Any] = {"n": 2, "seed": 4, "extra_body": NO_EOS, **HOT}
    whole = chat(client, **ask)
    texts, chunks, usage = ["", ""], 0, None
    finishes: list[str | None] = [None, None]
    for chunk in chat_stream(client, stream_options={"include_usage": True}, **ask):
        assert usage is None, "a chunk after the usage chunk"
        usage = chunk.usage
        for choice in chunk.choices:
            chunks += 1
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert finishes == ["length", "length"]
    assert chunks > 2 * 2  # streamed as generated, not one piece per choice
    assert usage is not None
    assert usage.completion_tokens == 2 * TOKENS
    assert whole.usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert texts == [c.message.content for c in whole.choices]

    finish, count = None, None
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    for piece in stream:
        if piece.usage is not None:
            count = piece.usage.completion_tokens
        for c in piece.choices:
            finish = c.finish_reason or finish
    assert finish == "length"
    assert count == TOKENS


# ---- tools and JSON modes (the engine tests' checks) -------------------------------------------------------


def check_tool_choice_auto(client: openai.OpenAI) -> None:
    """`auto` with the hermes parser: the random model writes no `<tool_call>`, so it answers in content."""
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=12, temperature=0)
    (choice,) = reply.choices
    assert not choice.message.tool_calls
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


def check_tools(client: openai.OpenAI) -> None:
    check_tool_choice_auto(client)
    check_named_tool(client)
    check_required_one_call(client)
    check_required_parallel(client)
    check_stream_reassembles(client)
    check_none_never_calls(client)
    check_history_with_calls(client)


def check_json_modes(client: openai.OpenAI) -> None:
    check_json_object_answer(client)
    check_json_schema_answer(client)
    check_json_schema_answer(client, stream=True)
    check_greedy_json_is_compact(client)


# ---- values at the edges: accepted ones served, refused ones 400 -------------------------------------------

# Per field, values at and past the edge of what vLLM takes (tests/runtime/test_sampling_ranges_vllm.py checks
# that the request models accept exactly these): each is answered 200 when the request model accepts it, 400
# when not, never 5xx.
EDGE_VALUES: dict[str, list[Any]] = {
    "temperature": [0.0, 5e-324, 2.0, 2.0000001, -1.0],
    "top_p": [5e-324, 1.0, 0.0, 1.0000001],
    "presence_penalty": [-2.0, 2.0, 2.0000001],
    "frequency_penalty": [-2.0, 2.0, -2.0000001],
    "seed": [0, -1, p.SEED_MIN, p.SEED_MAX, p.SEED_MAX + 1],
    "n": [16, 17, 0],
    "top_logprobs": [0, 20, 21],
    "stop": ["", [""], ["", "x"], ["a", "b", "c", "d"]],
}


def accepted(field: str, value: Any) -> bool:
    body: dict[str, Any] = {"model": MODEL, "messages": HELLO, "logprobs": True, field: value}
    try:
        p.ChatCompletionRequest.model_validate(body)
    except ValidationError:
        return False
    return True


def check_edge_values(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120, trust_env=False) as http:
        for field, values in EDGE_VALUES.items():
            for value in values:
                body = {"model": MODEL, "messages": HELLO, "max_tokens": 2, "logprobs": True, field: value}
                response = http.post("/chat/completions", json=body)
                want = 200 if accepted(field, value) else 400
                assert response.status_code == want, f"{field}={value!r}: {response.status_code} {response.text}"
                if want == 200:
                    expected = value if field == "n" else 1
                    assert len(response.json()["choices"]) == expected, response.text
                else:
                    assert response.json()["error"]["param"] is not None, response.text


def check_bad_tool_requests(base_url: str) -> None:
    for fields, param in BAD_REQUESTS.values():
        check_bad_request(base_url, fields, param)
    check_unenforceable_schema_is_400(base_url)


# ---- all of them -------------------------------------------------------------------------------------------

SAMPLING_CHECKS = (
    check_greedy_is_deterministic,
    check_seeds,
    check_top_p_and_temperature,
    check_penalties,
    check_max_completion_tokens,
    check_chat_logprobs,
    check_completion_logprobs,
    check_stop_strings,
    check_n,
    check_streams,
)


def check_every_option(client: openai.OpenAI, base_url: str) -> None:
    for check in SAMPLING_CHECKS:
        check(client)
    check_tools(client)
    check_json_modes(client)
    check_edge_values(base_url)
    check_bad_tool_requests(base_url)
