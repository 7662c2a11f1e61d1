"""What passes between our requests and vLLM's: SamplingParams from our options, the compact JSON grammar
for structured outputs, vLLM's tool parsers behind our interface, and vLLM's logprobs as ours.

vLLM is imported inside each function: this module is imported only with the vLLM engine.
"""

from __future__ import annotations

from typing import Any

from servlane_core.protocol.tools import ParsedToolCall

from .base import EngineError, SamplingOptions, TokenLogprob

# The tool parser when the config names none: the hermes/Qwen `<tool_call>` format most open models use.
DEFAULT_TOOL_CALL_PARSER = "hermes"


def sampling_params(options: SamplingOptions, guided: Any = None) -> Any:
    """vLLM's SamplingParams for our options (its constructor checks the values: ValueError when unfit)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        stop=list(options.stop) or None,
        seed=options.seed,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        logit_bias=dict(options.logit_bias) or None,
        logprobs=options.logprobs,
        ignore_eos=options.ignore_eos,
        # Only what is new since the last output (as `vllm serve` streams): no copying of the
        # whole text and token list at every step.
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=guided,
        skip_special_tokens=options.skip_special_tokens,
    )


def compact_json_grammar(schema: str) -> str | None:
    """The JSON schema as an xgrammar grammar (EBNF) with no free whitespace (`, ` and `: ` only), exactly as
    the transformers engine decodes it; None when xgrammar cannot express it (then vLLM's json mode, which
    may fall back to llguidance).

    Why a grammar: vLLM reads disable_any_whitespace from its engine config only (StructuredOutputsParams'
    field of that name is ignored), and the engine-wide setting needs one fixed backend instead of `auto`.
    """
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)
    except (RuntimeError, ValueError):
        return None
    return str(grammar)


def tool_parser_class(name: str | None) -> Any:
    """vLLM's tool parser class for a `--tool-call-parser` name (None: DEFAULT_TOOL_CALL_PARSER); an unknown
    name is an EngineError that lists the names this vLLM knows."""
    from vllm.tool_parsers import ToolParserManager

    name = name or DEFAULT_TOOL_CALL_PARSER
    known = ToolParserManager.list_registered()
    if name not in known:
        raise EngineError(f"unknown tool_call_parser {name!r}; this vLLM knows: {', '.join(known)}")
    return ToolParserManager.get_tool_parser(name)


class VllmToolParser:
    """One of vLLM's tool parsers (a class from tool_parser_class) behind our ToolCallParser interface."""

    def __init__(self, parser_class: Any, tokenizer: Any) -> None:
        self._parser_class: Any = parser_class
        self._tokenizer = tokenizer
        # Parsers without a start token (plain JSON formats): stream no content, parse it all at the end.
        marker = getattr(self._parser_class, "tool_call_start_token", "")
        self.start_marker = marker if isinstance(marker, str) else ""

    def parse(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ParsedToolCall]]:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        fields: dict[str, Any] = {"model": "-", "messages": []}
        if tools:  # vLLM refuses an empty list of tools
            fields["tools"] = tools
        request = ChatCompletionRequest.model_validate(fields)
        info = self._parser_class(self._tokenizer, request.tools).extract_tool_calls(text, request)
        if not info.tools_called:
            return text, []
        return info.content, [ParsedToolCall(c.function.name, c.function.arguments) for c in info.tool_calls]


def token_logprobs(per_token: Any, token_ids: Any, top_n: int) -> list[TokenLogprob]:
    """vLLM's per-position {token_id: Logprob} dicts for the new tokens `token_ids`, with `top_n` alternatives.

    vLLM's dict holds the sampled token and the `top_n` likeliest: `top_n + 1` entries when the sampled one is
    not among them. The alternatives are exactly the `top_n` likeliest (OpenAI's meaning, and the transformers
    engine's torch.topk), so the sampled token, ranked below them, is left out.
    """
    if not per_token:
        return []
    out: list[TokenLogprob] = []
    for index in range(len(per_token)):
        position = per_token[index]
        chosen = position[token_ids[index]]
        ranked = sorted((lp for lp in position.values() if lp.rank is not None), key=lambda lp: lp.rank)
        top = tuple((lp.decoded_token or "", float(lp.logprob)) for lp in ranked[:top_n])
        out.append(TokenLogprob(chosen.decoded_token or "", float(chosen.logprob), top))
    return out
