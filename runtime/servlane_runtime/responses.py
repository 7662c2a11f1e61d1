"""The OpenAI shapes of what an engine produced: a finished chat choice (its tool calls parsed), the
streamed tool-call deltas, finish reasons, logprobs in the chat and the legacy completion shape, usage and
base64 embeddings. Pure functions of the engine's output: serving decides when each is sent."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from servlane_core.protocol import openai as p
from servlane_core.protocol.tools import OutputPlan, ParsedToolCall

from .engines.base import TokenLogprob, ToolCallParser
from .tool_calls import ChoiceOutput


@dataclass
class Choice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    cached_tokens: int | None = None  # of its prompt (GenerationDelta.cached_tokens)


def token_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> p.Usage:
    return p.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=None if cached_tokens is None else p.PromptTokensDetails(cached_tokens=cached_tokens),
    )


def cached_sum(values: Sequence[int | None]) -> int | None:
    """The cached prompt tokens of several prompts; None when no engine said."""
    said = [v for v in values if v is not None]
    return sum(said) if said else None


def chat_choice(
    index: int, choice: Choice, plan: OutputPlan, parser: ToolCallParser | None, logprobs: p.ChoiceLogprobs | None
) -> p.ChatChoice:
    output = ChoiceOutput(plan, parser)
    content = output.push(choice.text)
    rest, calls = output.finish()
    content += rest
    message = p.AssistantMessage(
        content=content or (None if calls else ""),
        tool_calls=[
            p.ResponseToolCall(
                id=p.new_tool_call_id(), function=p.ResponseFunctionCall(name=c.name, arguments=c.arguments)
            )
            for c in calls
        ]
        or None,
    )
    return p.ChatChoice(
        index=index,
        message=message,
        logprobs=logprobs,
        finish_reason=finish_reason(choice.finish_reason, calls, plan.named is not None),
    )


def finish_reason(reason: str | None, calls: list[ParsedToolCall], named: bool = False) -> str | None:
    """`tool_calls` when the model stopped after calling tools (OpenAI's reason), except for a function that
    tool_choice named: `stop` there, as OpenAI and vLLM answer; a cut-off stays `length`."""
    return "tool_calls" if calls and reason == "stop" and not named else reason


def tool_call_deltas(calls: list[ParsedToolCall]) -> list[p.DeltaToolCall]:
    """OpenAI's streaming shape of each call: id, type and name first (arguments ""), then the arguments."""
    pieces = []
    for index, call in enumerate(calls):
        head = p.DeltaFunctionCall(name=call.name, arguments="")
        pieces.append(p.DeltaToolCall(index=index, id=p.new_tool_call_id(), type="function", function=head))
        pieces.append(p.DeltaToolCall(index=index, function=p.DeltaFunctionCall(arguments=call.arguments)))
    return pieces


# The floor of a logprob on the wire, as vLLM's: a token a grammar or logit_bias rules out has -inf, which JSON
# cannot carry (the answer was a 500, a stream's `null`).
LOGPROB_FLOOR = -9999.0


def finite(logprob: float) -> float:
    """The logprob, at least LOGPROB_FLOOR (NaN too)."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def chat_logprobs(items: list[TokenLogprob]) -> p.ChoiceLogprobs:
    return p.ChoiceLogprobs(
        content=[
            p.TokenLogprobEntry(
                token=t.token,
                logprob=finite(t.logprob),
                bytes=list(t.token.encode()),
                top_logprobs=[p.TopLogprob(token=s, logprob=finite(v), bytes=list(s.encode())) for s, v in t.top],
            )
            for t in items
        ]
    )


def completion_logprobs(items: list[TokenLogprob], start: int = 0) -> p.CompletionLogprobs:
    """The legacy shape: `logprobs: k` gives the k likeliest and always the sampled token too, first, so up
    to k + 1 entries (OpenAI's documented meaning, and what `vllm serve` returns). `text_offset` counts from
    `start`: in a stream, the length of the choice's text sent before these tokens."""
    offsets, at = [], start
    for t in items:
        offsets.append(at)
        at += len(t.token)
    return p.CompletionLogprobs(
        tokens=[t.token for t in items],
        token_logprobs=[finite(t.logprob) for t in items],
        top_logprobs=[{t.token: finite(t.logprob), **{s: finite(v) for s, v in t.top}} for t in items],
        text_offset=offsets,
    )


def base64_vector(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
