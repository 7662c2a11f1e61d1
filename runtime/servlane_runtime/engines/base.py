"""The one small interface every engine implements, and the plain data that crosses it.

Serving logic (OpenAI shapes, admission, metrics) talks only to `InferenceEngine`; engines know nothing of
HTTP. Nothing here imports torch, so the server imports without it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from servlane_core.protocol.tools import ParsedToolCall

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # OpenAI's logit_bias: (token id, bias added to its logit) pairs, the ids within vocab_size.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # How many alternatives to report per token; None: no logprobs at all.
    logprobs: int | None = None
    ignore_eos: bool = False
    # Guided decoding: the output must be JSON valid against this schema (compact JSON text).
    json_schema: str | None = None
    # False keeps special tokens in the text: some models' tool-call markers are special tokens.
    skip_special_tokens: bool = True
    # The LoRA adapter (its served name) that generates; None: the base model.
    adapter: str | None = None
    # W3C trace context (`traceparent`, ...) of the runtime's generate span, for an engine with its own spans.
    trace_headers: tuple[tuple[str, str], ...] = ()


# A prompt as text, or as the token ids InferenceEngine.tokenize gave for it.
PromptInput = str | list[int]


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass
class GenerationDelta:
    """New text since the previous delta; the last delta of a generation carries `finish_reason`."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # Prompt tokens taken from a kept KV cache instead of computed; None: the engine does not say.
    cached_tokens: int | None = None


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: list[list[float]]
    prompt_tokens: int


class EngineError(Exception):
    """A failure the engine can explain (bad model files, unsupported task)."""


class RequestNotSupported(EngineError):
    """This request cannot run on this model or engine (tools without a template for them, a schema guided
    decoding cannot compile, a sampling value the engine refuses): the client's to fix, a 400. `param`
    names the request field at fault when the engine knows it (None: the request as a whole)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ToolCallParser(Protocol):
    """Reads the tool calls out of a model's text, in the format its chat template taught it."""

    @property
    def start_marker(self) -> str:
        """The text that opens a tool call: streamed content is held back from here on."""

    def parse(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ParsedToolCall]]:
        """The content (text outside tool calls; None if there is none) and the calls, in order."""


class AdapterUsers:
    """How many generations use each adapter, so that unloading one waits for them to end."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}

    @contextlib.contextmanager
    def using(self, name: str | None) -> Iterator[None]:
        if name is None:
            yield
            return
        self._counts[name] = self._counts.get(name, 0) + 1
        self._idle.setdefault(name, asyncio.Event()).clear()
        try:
            yield
        finally:
            self._counts[name] -= 1
            if self._counts[name] == 0:
                del self._counts[name]
                self._idle.pop(name).set()

    async def drained(self, name: str, limit_seconds: float) -> None:
        """Return when no generation uses `name` any more, or after `limit_seconds`."""
        idle = self._idle.get(name)
        if idle is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(idle.wait(), limit_seconds)


class EngineDeadError(Exception):
    """The engine can no longer serve anything (vLLM's engine core process is gone, the device failed).

    Not an EngineError: that one is about a request or the model files; this one ends the process, so
    that Kubernetes restarts it.
    """


class InferenceEngine(abc.ABC):
    """A loaded model that can generate text or embed it."""

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int | None:
        """How many token ids the model's output layer scores (loaded); None: not known (logit_bias refused)."""
        return None

    @abc.abstractmethod
    async def load(self) -> None:
        """Load weights and tokenizer; heavy work must run off the event loop."""

    @abc.abstractmethod
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for a chat, through the tokenizer's chat template (with `tools`, if any: raises
        RequestNotSupported when the template has no place for them)."""

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """The token ids `text` becomes as a prompt (special tokens included): what generate reads for it."""

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` becomes as a prompt."""
        return len(self.tokenize(text))

    @abc.abstractmethod
    def generate(
        self, prompt: PromptInput, options: SamplingOptions, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Stream the completion of `prompt` (text, or the ids tokenize gave for it: the server counts a prompt's
        tokens before it starts, and need not have the engine tokenize it twice). Closing the iterator early stops
        the generation."""

    @abc.abstractmethod
    async def embed(self, inputs: list[PromptInput]) -> EmbeddingResult:
        """One normalised vector per input: a text, or token ids taken as they are (as vLLM takes them)."""

    def check_json_schema(self, schema: str) -> None:
        """Raise RequestNotSupported if guided decoding cannot enforce `schema` (called before generating,
        so a bad schema is a 400 before any stream starts). The default: no guided decoding at all."""
        raise RequestNotSupported("this engine does not support structured outputs")

    def tool_parser(self) -> ToolCallParser | None:
        """The engine's own tool-call parser; None: the runtime's (hermes/Qwen `<tool_call>` JSON)."""
        return None

    async def load_adapter(self, name: str, path: str) -> None:
        """Serve the LoRA adapter in directory `path` as `name` from now on (EngineError if it cannot)."""
        raise EngineError("this engine does not serve LoRA adapters")

    async def unload_adapter(self, name: str) -> None:
        """Stop serving adapter `name` once the generations that use it have ended."""
        raise EngineError("this engine does not serve LoRA adapters")

    async def check_health(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Raise EngineDeadError if the engine has died; called periodically while serving."""

    async def close(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Free the engine's resources."""
