"""What the runtime checks of a request against the model it serves, before any generation: the task the model is
loaded for, token ids within its vocabulary, a prompt within its context. Each failure is the client's to fix, a
400 naming the field, where the engine would otherwise fail while generating (a 500, or an error inside a 200
stream)."""

from __future__ import annotations

from servlane_core.protocol import openai as p
from servlane_core.protocol.errors import OpenAIError


def check_task(loaded: str, task: str, endpoint: str, model: str) -> None:
    """A 400 for an endpoint the model is not loaded for: the engines refused it only once generating, as their
    own error, which answered 500 (and the openai SDK retried it)."""
    if loaded != task:
        use = "/v1/embeddings" if loaded == "embed" else "/v1/chat/completions or /v1/completions"
        message = f"model '{model}' is loaded for task '{loaded}', which {endpoint} does not serve: use {use}"
        raise OpenAIError(400, message, param="model", code="model_not_supported")


def context_too_long(n_prompt: int, max_len: int, param: str) -> OpenAIError:
    """A 400, as OpenAI and vLLM answer (the openai SDK raises BadRequestError, which clients catch to shorten
    and retry), naming the field: messages, prompt or input."""
    message = f"The prompt is {n_prompt} tokens; this model's context length is {max_len} tokens."
    return OpenAIError(400, message, param=param, code="context_length_exceeded")


def checked_prompt_ids(vocab: int | None, ids: list[int], param: str = "prompt") -> list[int]:
    """A prompt (or an embedding's input: `param`) given as token ids, each within the vocabulary (past it, it
    would index beyond the embeddings)."""
    if vocab is None:
        raise OpenAIError(400, f"this model's engine takes {param} as text only", param=param)
    beyond = next((token for token in ids if token >= vocab), None)
    if beyond is not None:
        message = f"the {param} holds token {beyond}, which this model's vocabulary ({vocab} tokens) lacks"
        if param == "input":  # the usual sender of another model's ids
            message += " (LangChain's OpenAIEmbeddings sends OpenAI's token ids: set check_embedding_ctx_length=False)"
        raise OpenAIError(400, message, param=param, code="invalid_request")
    return ids


def checked_logit_bias(vocab: int | None, req: p.SamplingFields) -> tuple[tuple[int, float], ...]:
    """The request's logit_bias as (token id, bias) pairs, the ids within the vocabulary (past it, they would
    index beyond the logits)."""
    bias = req.bias_items()
    if not bias:
        return ()
    if vocab is None:
        raise OpenAIError(400, "this model's engine does not take logit_bias", param="logit_bias")
    beyond = next((token for token, _ in bias if token >= vocab), None)
    if beyond is not None:
        message = f"logit_bias names token {beyond}, which this model's vocabulary ({vocab} tokens) lacks"
        raise OpenAIError(400, message, param="logit_bias", code="invalid_request")
    return bias
