"""Engine-agnostic OpenAI serving: requests in, responses or SSE chunks out.

Knows the OpenAI shapes (built in `responses`), context-length rules, usage and metrics; knows nothing of
HTTP routing or of which engine runs (that is `InferenceEngine`). Admission is the router's job, around these
calls.
Chat templates and tokenisation of long prompts run in worker threads: a multi-megabyte prompt takes a second or
more to render and count, and the event loop must keep answering /health and streaming other requests. A short
one (most chats) runs on the event loop: the work is a fraction of a millisecond, less than a hop to a thread and
back (which, on a busy machine, also waits for a CPU). A prompt is tokenized once: its count decides the 400 (too
long for the context), and the engine is given the same ids. What is checked of a request against the model is
`request_checks`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from servlane_core.protocol import openai as p
from servlane_core.protocol.errors import OpenAIError, model_not_found
from servlane_core.protocol.tools import plan_output, template_messages
from servlane_runtime.runtime_metrics import RuntimeMetrics
from servlane_web.tracing import NO_SPANS, Phase, RequestSpans

from .engines.base import (
    EngineError,
    GenerationDelta,
    InferenceEngine,
    PromptInput,
    RequestNotSupported,
    SamplingOptions,
)
from .model_host import ModelHost
from .request_checks import check_task, checked_logit_bias, checked_prompt_ids, context_too_long
from .responses import (
    Choice,
    base64_vector,
    cached_sum,
    chat_choice,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    token_usage,
    tool_call_deltas,
)
from .streams import SSE_DONE, ContentChunkFrames, merge_generations, sse
from .tool_calls import ChoiceOutput

log = logging.getLogger(__name__)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Text up to this many characters is rendered and tokenized on the event loop (see the module's docstring).
INLINE_CHARS = 4096
_T = TypeVar("_T")


async def off_loop_if_long(chars: int, work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)` here when its input is at most INLINE_CHARS characters, else in a worker thread."""
    if chars <= INLINE_CHARS:
        return work(*args)
    return await asyncio.to_thread(work, *args)


def text_size(value: Any, limit: int = INLINE_CHARS) -> int:
    """About how much text a template renders from `value` (messages, tools: JSON-like dicts, lists, strings):
    the characters of its strings and keys, 1 for any other value (a list of a million numbers is large too),
    counted until past `limit`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        items: Iterable[Any] = itertools.chain(value.keys(), value.values())
    elif isinstance(value, list | tuple):
        items = value
    else:
        return 1
    total = 0
    for item in items:
        total += text_size(item, limit - total)
        if total > limit:
            break
    return total


@dataclass(frozen=True)
class _StreamAsk:
    """What every frame of one streamed answer repeats, and what the client asked of the stream."""

    request_id: str
    model: str
    created: int
    include_usage: bool
    logprobs: bool
    # The request field a JSON schema came from: a schema that dead-ends midway is the client's to fix there.
    schema_param: str = "response_format"
    named_tool: bool = False  # tool_choice named a function: its calls finish with "stop"

    @classmethod
    def of(cls, req: p.ChatCompletionRequest | p.CompletionRequest, request_id: str, logprobs: bool) -> _StreamAsk:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return cls(request_id, req.model, p.now(), include_usage, logprobs)


class OpenAIServing:
    def __init__(self, host: ModelHost, metrics: RuntimeMetrics) -> None:
        self.host = host
        self.metrics = metrics
        self.name = host.config.served_model_name

    def models(self) -> p.ModelList:
        max_len = self.host.engine.max_model_len if self.host.state == "ready" else None
        created = p.now()
        cards = [p.ModelCard(id=self.name, created=created, root=self.host.config.model_source, max_model_len=max_len)]
        if self.host.adapters is not None:
            cards += [
                p.ModelCard(id=name, created=created, root=name, parent=self.name, max_model_len=max_len)
                for name in self.host.adapters.ready_names()
            ]
        return p.ModelList(data=cards)

    def check_model(self, model: str) -> InferenceEngine:
        """The engine for `model`: the base model's name or a ready adapter's; else 404 (unknown) or 503."""
        adapters = self.host.adapters
        if model != self.name and (adapters is None or not adapters.knows(model)):
            raise model_not_found(model)
        engine = self.host.engine
        if model != self.name and adapters is not None:
            adapters.check(model)
        return engine

    def _adapter(self, model: str) -> str | None:
        return None if model == self.name else model

    # ---- generation -----------------------------------------------------------------------

    def _first_token_clock(self, endpoint: str) -> Callable[[], None]:
        """Call at every output: the first call records the time to first token (from now) and the pod's
        first answer; later calls do nothing."""
        started = time.monotonic()
        seen = False

        def first_token() -> None:
            nonlocal seen
            if not seen:
                seen = True
                self.metrics.ttft.labels(endpoint).observe(time.monotonic() - started)
                self.host.startup.mark("first_token")

        return first_token

    async def _options(
        self,
        engine: InferenceEngine,
        prompt: str | list[int],
        req: p.SamplingFields,
        max_tokens: int | None,
        top: int | None,
    ) -> tuple[list[int], SamplingOptions]:
        """`prompt`'s token ids (given, or its text's) and its sampling options, or a 400 when the prompt alone
        fills the context or names a token the model does not have."""
        if isinstance(prompt, list):
            ids = checked_prompt_ids(engine.vocab_size, prompt)
        else:
            ids = await off_loop_if_long(len(prompt), engine.tokenize, prompt)
        room = engine.max_model_len - len(ids)
        if room <= 0:
            param = "messages" if isinstance(req, p.ChatCompletionRequest) else "prompt"
            raise context_too_long(len(ids), engine.max_model_len, param)
        return ids, SamplingOptions(
            logit_bias=checked_logit_bias(engine.vocab_size, req),
            max_tokens=min(max_tokens or room, room),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop=tuple(req.stop_list()),
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logprobs=top,
            ignore_eos=req.ignore_eos,
            adapter=self._adapter(req.model),
        )

    def _start(
        self,
        engine: InferenceEngine,
        prompts: Sequence[tuple[PromptInput, SamplingOptions]],
        n: int,
        request_id: str,
        spans: RequestSpans = NO_SPANS,
    ) -> AsyncGenerator[tuple[int, GenerationDelta], None]:
        generation = spans.phase("generate", {"gen_ai.request.id": request_id})
        # The engine's own spans (vLLM's llm_request) join the trace under this one.
        trace_headers = tuple(generation.headers().items())
        streams: list[AsyncGenerator[GenerationDelta, None]] = []
        for prompt, options in prompts:
            for i in range(n):
                seeded = options if options.seed is None else _with_seed(options, options.seed + i)
                seeded = replace(seeded, trace_headers=trace_headers) if trace_headers else seeded
                streams.append(engine.generate(prompt, seeded, f"{request_id}-{len(streams)}"))
        return _traced(merge_generations(streams), generation)

    async def _collect(
        self, endpoint: str, merged: AsyncGenerator[tuple[int, GenerationDelta], None], count: int, n: int
    ) -> tuple[list[Choice], dict[int, int]]:
        """Run generations to the end; also returns each choice's prompt token count."""
        choices = [Choice() for _ in range(count)]
        prompt_tokens: dict[int, int] = {}
        first_token = self._first_token_clock(endpoint)
        try:
            async for index, delta in merged:
                first_token()
                choice = choices[index]
                choice.text += delta.text
                choice.logprobs += delta.logprobs
                choice.completion_tokens = delta.completion_tokens
                choice.finish_reason = delta.finish_reason or choice.finish_reason
                if delta.cached_tokens is not None:
                    choice.cached_tokens = delta.cached_tokens
                prompt_tokens[index] = delta.prompt_tokens
        finally:
            await merged.aclose()
            # Counted however it ends: tokens generated for a client that left were still work.
            prompt = sum(v for i, v in prompt_tokens.items() if i % n == 0)
            self.metrics.count_tokens(prompt, sum(c.completion_tokens for c in choices))
        return choices, prompt_tokens

    async def chat(
        self, req: p.ChatCompletionRequest, spans: RequestSpans = NO_SPANS
    ) -> p.ChatCompletionResponse | AsyncIterator[str]:
        engine = self.check_model(req.model)
        check_task(self.host.config.task, "generate", "/v1/chat/completions", self.name)
        plan = plan_output(req)
        messages = template_messages(req.messages)
        try:
            size = text_size(messages) + text_size(plan.tools or [])
            prompt = await off_loop_if_long(size, engine.render_chat, messages, plan.tools)
        except RequestNotSupported as exc:
            raise OpenAIError(400, str(exc), param="tools", code="tools_not_supported") from exc
        except EngineError as exc:
            raise OpenAIError(400, str(exc), param="messages") from exc
        except Exception as exc:  # a template's own raise_exception(), e.g. roles out of order
            raise OpenAIError(400, f"the chat template rejected the messages: {exc}", param="messages") from exc
        schema_param = "tools" if plan.tool_mode == "forced" else "response_format"  # where the schema came from
        if plan.json_schema is not None:
            try:
                await asyncio.to_thread(engine.check_json_schema, plan.json_schema)
            except RequestNotSupported as exc:
                raise OpenAIError(400, str(exc), param=schema_param, code="invalid_schema") from exc
        top = (req.top_logprobs or 0) if req.logprobs else None
        with spans.phase("tokenize"):
            ids, options = await self._options(engine, prompt, req, req.max_completion_tokens or req.max_tokens, top)
        # With tools the model may mark its calls with special tokens (`<tool_call>` is one in some models):
        # they must reach the parser (vLLM's hermes parser asks its server for the same).
        options = replace(options, json_schema=plan.json_schema, skip_special_tokens=plan.tool_mode != "auto")
        parser = engine.tool_parser() if plan.tool_mode == "auto" else None
        request_id = p.new_id("chatcmpl")
        merged = self._start(engine, [(ids, options)], req.n, request_id, spans)
        if req.stream:
            outputs = [ChoiceOutput(plan, parser) for _ in range(req.n)]
            ask = _StreamAsk.of(req, request_id, bool(req.logprobs))
            ask = replace(ask, schema_param=schema_param, named_tool=plan.named is not None)
            return self._chat_stream(merged, outputs, ask)
        try:
            choices, prompts = await self._collect(CHAT, merged, req.n, req.n)
        except RequestNotSupported as exc:  # an engine that validates only when generation starts (vLLM)
            raise OpenAIError(400, str(exc), param=_param_of(exc, schema_param), code="invalid_request") from exc
        return p.ChatCompletionResponse(
            id=request_id,
            created=p.now(),
            model=req.model,
            choices=[
                chat_choice(i, c, plan, parser, chat_logprobs(c.logprobs) if req.logprobs else None)
                for i, c in enumerate(choices)
            ],
            usage=token_usage(prompts.get(0, 0), sum(c.completion_tokens for c in choices), choices[0].cached_tokens),
        )

    async def _chat_stream(
        self,
        merged: AsyncGenerator[tuple[int, GenerationDelta], None],
        outputs: list[ChoiceOutput],
        ask: _StreamAsk,
    ) -> AsyncIterator[str]:
        n, logprobs = len(outputs), ask.logprobs

        def chunk(choices: list[p.ChatChunkChoice], usage: p.Usage | None = None) -> str:
            return sse(
                p.ChatCompletionChunk(
                    id=ask.request_id, created=ask.created, model=ask.model, choices=choices, usage=usage
                )
            )

        first_token = self._first_token_clock(CHAT)
        completion = [0] * n
        prompt_tokens = 0
        cached: int | None = None
        frames = ContentChunkFrames(ask.request_id, ask.created, ask.model)
        try:
            yield chunk([p.ChatChunkChoice(index=i, delta=p.ChatDelta(role="assistant", content="")) for i in range(n)])
            async for index, delta in merged:
                first_token()
                completion[index] = delta.completion_tokens
                prompt_tokens = delta.prompt_tokens
                if index == 0 and delta.cached_tokens is not None:
                    cached = delta.cached_tokens
                text = outputs[index].push(delta.text)
                if index == 0 and text and not logprobs:
                    yield frames.frame(text)
                elif text or (delta.logprobs and logprobs):
                    content = p.ChatDelta(content=text)
                    lp = chat_logprobs(delta.logprobs) if logprobs else None
                    yield chunk([p.ChatChunkChoice(index=index, delta=content, logprobs=lp)])
                if delta.finish_reason is not None:
                    rest, calls = outputs[index].finish()
                    if rest:
                        yield chunk([p.ChatChunkChoice(index=index, delta=p.ChatDelta(content=rest))])
                    for piece in tool_call_deltas(calls):
                        yield chunk([p.ChatChunkChoice(index=index, delta=p.ChatDelta(tool_calls=[piece]))])
                    reason = finish_reason(delta.finish_reason, calls, ask.named_tool)
                    yield chunk([p.ChatChunkChoice(index=index, delta=p.ChatDelta(), finish_reason=reason)])
            usage = token_usage(prompt_tokens, sum(completion), cached)
            if ask.include_usage:
                yield chunk([], usage)
        except (OpenAIError, EngineError) as exc:
            yield _error_frame(exc, ask.schema_param)
        except Exception as exc:  # a bug: the stream still ends with an error event and [DONE], never cut
            log.exception("unexpected error while streaming %s", ask.request_id)
            yield _error_frame(exc)
        finally:
            await merged.aclose()
            self.metrics.count_tokens(prompt_tokens, sum(completion))
        yield SSE_DONE

    async def completions(
        self, req: p.CompletionRequest, spans: RequestSpans = NO_SPANS
    ) -> p.CompletionResponse | AsyncIterator[str]:
        engine = self.check_model(req.model)
        check_task(self.host.config.task, "generate", "/v1/completions", self.name)
        if req.echo and req.logprobs is not None:
            # The echoed prompt's tokens would need logprobs of their own, which no engine here computes.
            raise OpenAIError(400, "echo with logprobs is not supported", param="echo", code="invalid_request")
        texts = req.prompts()
        if req.echo and not all(isinstance(t, str) for t in texts):
            raise OpenAIError(400, "echo needs the prompt as text", param="echo", code="invalid_request")
        with spans.phase("tokenize"):
            prompts = [await self._options(engine, text, req, req.max_tokens, req.logprobs) for text in texts]
        request_id = p.new_id("cmpl")
        merged = self._start(engine, prompts, req.n, request_id, spans)
        count = len(prompts) * req.n
        # echo: each choice's text begins with its prompt (choice i answers prompt i // n).
        echoes = [str(texts[i // req.n]) if req.echo else "" for i in range(count)]
        if req.stream:
            ask = _StreamAsk.of(req, request_id, req.logprobs is not None)
            return self._completion_stream(merged, req.n, echoes, ask)
        try:
            choices, prompt_counts = await self._collect(COMPLETIONS, merged, count, req.n)
        except RequestNotSupported as exc:  # an engine that validates only when generation starts (vLLM)
            raise OpenAIError(400, str(exc), param=exc.param, code="invalid_request") from exc
        prompt_tokens = sum(prompt_counts.get(i * req.n, 0) for i in range(len(prompts)))
        return p.CompletionResponse(
            id=request_id,
            created=p.now(),
            model=req.model,
            choices=[
                p.CompletionChoice(
                    index=i,
                    text=echoes[i] + c.text,
                    logprobs=completion_logprobs(c.logprobs) if req.logprobs is not None else None,
                    finish_reason=c.finish_reason,
                )
                for i, c in enumerate(choices)
            ],
            usage=token_usage(
                prompt_tokens,
                sum(c.completion_tokens for c in choices),
                cached_sum([choices[i * req.n].cached_tokens for i in range(len(prompts))]),
            ),
        )

    async def _completion_stream(
        self,
        merged: AsyncGenerator[tuple[int, GenerationDelta], None],
        n: int,
        echoes: list[str],
        ask: _StreamAsk,
    ) -> AsyncIterator[str]:
        """`echoes`: per choice, what its first chunk begins with (its prompt, with echo; else "")."""
        count = len(echoes)
        pending = list(echoes)

        def response(choices: list[p.CompletionChoice], usage: p.Usage | None = None) -> str:
            return sse(
                p.CompletionResponse(
                    id=ask.request_id, created=ask.created, model=ask.model, choices=choices, usage=usage
                )
            )

        first_token = self._first_token_clock(COMPLETIONS)
        completion = [0] * count
        prompt_by_choice = [0] * count
        cached_by_choice: list[int | None] = [None] * count
        offsets = [0] * count  # per choice, the text its tokens' logprobs covered so far (their text_offset)
        try:
            async for index, delta in merged:
                first_token()
                completion[index] = delta.completion_tokens
                prompt_by_choice[index] = delta.prompt_tokens
                if delta.cached_tokens is not None:
                    cached_by_choice[index] = delta.cached_tokens
                lp = None
                if ask.logprobs:
                    lp = completion_logprobs(delta.logprobs, offsets[index])
                    offsets[index] += sum(len(t.token) for t in delta.logprobs)
                text, pending[index] = pending[index] + delta.text, ""
                choice = p.CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=delta.finish_reason)
                yield response([choice])
            usage = token_usage(sum(prompt_by_choice[::n]), sum(completion), cached_sum(cached_by_choice[::n]))
            if ask.include_usage:
                yield response([], usage)
        except (OpenAIError, EngineError) as exc:
            yield _error_frame(exc)
        except Exception as exc:  # a bug: the stream still ends with an error event and [DONE], never cut
            log.exception("unexpected error while streaming %s", ask.request_id)
            yield _error_frame(exc)
        finally:
            await merged.aclose()
            self.metrics.count_tokens(sum(prompt_by_choice[::n]), sum(completion))
        yield SSE_DONE

    # ---- embeddings -----------------------------------------------------------------------

    async def embeddings(self, req: p.EmbeddingRequest) -> p.EmbeddingResponse:
        engine = self.check_model(req.model)
        check_task(self.host.config.task, "embed", "/v1/embeddings", self.name)
        inputs = req.inputs()  # at least one, none empty (the request's schema)
        for given in inputs:
            if isinstance(given, list):
                checked_prompt_ids(engine.vocab_size, given, "input")
        counts = await asyncio.to_thread(
            lambda: [len(given) if isinstance(given, list) else engine.count_tokens(given) for given in inputs]
        )
        for n_tokens in counts:
            if n_tokens > engine.max_model_len:
                raise context_too_long(n_tokens, engine.max_model_len, "input")
        try:
            result = await engine.embed(inputs)
        except EngineError as exc:
            raise OpenAIError(400, str(exc), param="model") from exc
        self.metrics.count_tokens(result.prompt_tokens, 0)
        self.host.startup.mark("first_token")  # an embedding model's first answer
        size = len(result.vectors[0]) if result.vectors else 0
        if req.dimensions is not None and req.dimensions != size:
            message = f"this model's embeddings have {size} dimensions and cannot be shortened to {req.dimensions}"
            raise OpenAIError(400, message, param="dimensions", code="invalid_request")
        data = [
            p.EmbeddingData(index=i, embedding=base64_vector(v) if req.encoding_format == "base64" else v)
            for i, v in enumerate(result.vectors)
        ]
        return p.EmbeddingResponse(data=data, model=self.name, usage=token_usage(result.prompt_tokens, 0))


async def _traced(
    merged: AsyncGenerator[tuple[int, GenerationDelta], None], generation: Phase
) -> AsyncGenerator[tuple[int, GenerationDelta], None]:
    """The generation as one span: its first token an event (time to first token), its end the span's."""
    first = True
    try:
        async for index, delta in merged:
            if first:
                generation.event("first_token")
                first = False
            yield index, delta
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            generation.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        await merged.aclose()
        generation.end()


def _param_of(exc: RequestNotSupported, schema_param: str) -> str | None:
    """The field an engine's refusal names, with a JSON schema's named where the request gave it (engines say
    response_format; a forced tool call's schema came from `tools`)."""
    return schema_param if exc.param == "response_format" else exc.param


def _error_frame(exc: Exception, schema_param: str = "response_format") -> str:
    """A failure midway through a stream, as its last data frame (the 200 status line is long sent): the
    client's (RequestNotSupported: a 400's error, e.g. a JSON schema that admits nothing more), the engine's
    (its message), or a bug's (a generic message; the log has the rest)."""
    if isinstance(exc, OpenAIError):
        error = exc
    elif isinstance(exc, RequestNotSupported):
        error = OpenAIError(400, str(exc), param=_param_of(exc, schema_param), code="invalid_request")
    elif isinstance(exc, EngineError):
        error = OpenAIError(500, str(exc), type="server_error")
    else:
        error = OpenAIError(500, "The runtime had an error while generating.", type="server_error")
    return sse(error.body())


def _with_seed(options: SamplingOptions, seed: int) -> SamplingOptions:
    return replace(options, seed=seed)
