"""OpenAI wire types: pydantic request/response models only (no torch, no engine).

Requests ignore unknown fields (like OpenAI-compatible servers do) but are strict about types:
`"max_tokens": "5"` is a 400, not a silent coercion. Numeric ranges are vLLM's own (SamplingParams and
its OpenAI protocol), so a request either engine would refuse is a 400 here, never a 500 there.
"""

from __future__ import annotations

import time
import uuid
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

# At most this many tokens biased per request: each is added to every step's logits.
MAX_LOGIT_BIAS = 1024
# vLLM's bounds on `seed` (a signed 64-bit integer: what torch's generators and vLLM's transport accept).
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1


def _null_takes_default(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """In the OpenAPI schema, each field with a default also takes null (see _Request)."""
    properties = schema.get("properties", {})
    for name in _defaulted(cls):
        given = properties.get(name)
        if given is None or ("anyOf" in given and {"type": "null"} in given["anyOf"]):
            continue
        described = {k: given[k] for k in ("title", "default", "description") if k in given}
        shape = {k: v for k, v in given.items() if k not in described}
        properties[name] = {"anyOf": [shape, {"type": "null"}], **described}


@cache
def _defaulted(cls: type[BaseModel]) -> frozenset[str]:
    """The wire names of the fields of `cls` with a default other than None."""
    return frozenset(
        field.alias or name
        for name, field in cls.model_fields.items()
        if not field.is_required() and (field.default_factory is not None or field.default is not None)
    )


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra=_null_takes_default)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        # OpenAI's reference takes null for every optional field (`"n": null` is n's default), as vLLM's
        # Optional fields do: a client that sends its unset options as null (SDKs, LangChain) got a 400.
        if isinstance(data, dict) and None in data.values():
            defaulted = _defaulted(cls)
            return {k: v for k, v in data.items() if v is not None or k not in defaulted}
        return data


class StreamOptions(_Request):
    include_usage: bool = False


class TextPart(_Request):
    type: Literal["text"]
    text: str


# OpenAI's rule for function and schema names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionCall(_Request):
    name: str
    # A JSON object as text, as the model wrote it (OpenAI's wire form; not always valid JSON).
    arguments: str


class ToolCall(_Request):
    """A call an assistant message made earlier in the conversation (sent back with the history)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # role assistant: the calls it made
    tool_call_id: str | None = Field(default=None, validate_default=True)  # role tool: which call it answers

    @field_validator("content")
    @classmethod
    def _content_given(cls, content: object, info: ValidationInfo) -> object:
        # Only an assistant message may leave it out (its tool calls are the message), as OpenAI requires.
        if content is None and info.data.get("role", "assistant") != "assistant":
            raise ValueError(f"a {info.data['role']} message needs content")
        return content

    @field_validator("tool_call_id")
    @classmethod
    def _tool_results_name_their_call(cls, call_id: str | None, info: ValidationInfo) -> str | None:
        if call_id is None and info.data.get("role") == "tool":
            raise ValueError("a tool message needs the tool_call_id of the call it answers")  # as OpenAI refuses
        return call_id

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(_Request):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    user: str | None = None
    # Token id (as text, JSON's keys) -> a bias in [-100, 100] added to its logit (OpenAI's bounds, refused
    # outside them); the ids are checked against the model's vocabulary when it answers.
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    # vLLM's extension: keep generating past the end-of-sequence token (benchmarks, load tests).
    ignore_eos: bool = False

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_bounds(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not (token.isascii() and token.isdigit()) or len(token) > 12:  # "²".isdigit(), and int() fails
                raise ValueError(f"logit_bias keys are token ids: {token[:20]!r} is not one")
            if not -100 <= value <= 100:
                raise ValueError(f"logit_bias values are between -100 and 100: {token} has {value}")
        return bias

    def bias_items(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(token), value) for token, value in (self.logit_bias or {}).items())

    @field_validator("stream_options")
    @classmethod
    def _only_for_streams(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options can only be given with stream: true")  # as OpenAI and vLLM refuse
        return options

    def stop_list(self) -> list[str]:
        """The stop strings, without empty ones (as in a list, so for a lone `""` too: vLLM refuses them)."""
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class FunctionDefinition(_Request):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: the function takes no arguments
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    # `schema` is the wire name; the attribute is not, as it would shadow BaseModel.schema().
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema")
        return self


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")  # as OpenAI and vLLM refuse
        return top

    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
NonEmptyText = Annotated[str, Field(min_length=1)]
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's bound on an embeddings request's array


class CompletionRequest(SamplingFields):
    # Text, texts, or token ids (one prompt or several), as OpenAI and vLLM take them.
    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    # OpenAI's and vLLM's default for this endpoint (chat's is the rest of the context); null: the context.
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    # Fill-in-the-middle: no engine here does it, so it is refused rather than ignored (vLLM refuses it too).
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return suffix

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text, or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]  # a text, or one prompt's ids
        return list(prompt)  # texts, or several prompts' ids


class EmbeddingRequest(_Request):
    model: str
    # Text, texts, or token ids (one input or several), as OpenAI and vLLM take them; never an empty text, as
    # OpenAI refuses it (its vector would say nothing); at most OpenAI's 2048 inputs in a request.
    input: (
        NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
        | TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    )  # fmt: skip
    encoding_format: Literal["float", "base64"] = "float"
    # Shorter vectors (OpenAI's text-embedding-3): only a model trained for it (Matryoshka) may be cut; this
    # runtime serves none, so only the model's own size is taken (vLLM refuses the rest too).
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """One entry per input: its text, or its token ids."""
        given = self.input
        if isinstance(given, str) or isinstance(given[0], int):
            return [given]  # a text, or one input's ids
        return list(given)  # texts, or several inputs' ids


# ---- responses -------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    # Prompt tokens served from a kept KV cache rather than computed again (OpenAI's field); only where the
    # engine says (the llama.cpp engine), left out of the JSON otherwise.
    prompt_tokens_details: PromptTokensDetails | None = Field(default=None, exclude_if=lambda v: v is None)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobEntry]


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    # null when the answer is only tool calls (as OpenAI answers); the key is left out when there are none.
    content: str | None
    tool_calls: list[ResponseToolCall] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=lambda v: v is None)
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """One piece of a streamed tool call: the first has id, type and name (arguments ""), later ones
    only `index` and argument text to append (OpenAI's streaming shape)."""

    index: int
    id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    type: Literal["function"] | None = Field(default=None, exclude_if=lambda v: v is None)
    function: DeltaFunctionCall


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servlane"
    root: str | None = None
    # For a LoRA adapter: the base model it runs on (as vLLM's /v1/models says).
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
