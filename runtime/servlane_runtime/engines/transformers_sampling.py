"""The transformers engine's sampling, on torch tensors: OpenAI's presence and frequency penalties, greedy or
top-p sampling with logprobs, and xgrammar's mask for structured outputs (Guide)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from .base import SamplingOptions, TokenLogprob

# vLLM raises a temperature in (0, 0.01) to 0.01: below it logits / temperature overflows to inf and NaN.
_MIN_TEMPERATURE = 1e-2


def sample(
    logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator, token_text: Callable[[int], str]
) -> tuple[int, TokenLogprob | None]:
    """The next token (greedy at temperature 0, else top-p sampling) and, when asked, its logprob and the
    `options.logprobs` likeliest alternatives (OpenAI's meaning)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    if options.temperature <= 0:
        token = int(torch.argmax(logits))
    else:
        probs = torch.softmax(logits / max(options.temperature, _MIN_TEMPERATURE), dim=-1)
        if options.top_p < 1.0:
            probs = top_p(probs, options.top_p)
        token = int(torch.multinomial(probs, 1, generator=generator))
    if options.logprobs is None:
        return token, None
    top: tuple[tuple[str, float], ...] = ()
    if options.logprobs > 0:
        values, ids = torch.topk(logprobs, options.logprobs)
        top = tuple((token_text(int(i)), float(v)) for v, i in zip(values, ids, strict=True))
    return token, TokenLogprob(token_text(token), float(logprobs[token]), top)


class Guide:
    """One generation's xgrammar matcher: masks what the grammar forbids next, follows what was sampled."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar

        self._xgr = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)

    def mask(self, logits: torch.Tensor) -> None:
        if self._matcher.is_terminated():
            return
        self._matcher.fill_next_token_bitmask(self._bitmask)
        self._xgr.apply_token_bitmask_inplace(logits.view(1, -1), self._bitmask.to(logits.device))

    def accept(self, token: int) -> None:
        if not self._matcher.is_terminated():
            self._matcher.accept_token(token)


def penalised(logits: torch.Tensor, counts: Counter[int], options: SamplingOptions) -> torch.Tensor:
    """OpenAI's penalties: subtract presence once and frequency per occurrence of each seen token."""
    if not counts or (options.presence_penalty == 0 and options.frequency_penalty == 0):
        return logits
    ids = torch.tensor(list(counts.keys()), device=logits.device)
    freq = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
    logits = logits.clone()
    logits[ids] -= options.presence_penalty + options.frequency_penalty * freq
    return logits


def top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    keep[0] = True  # the likeliest token always stays: a tiny top_p (5e-324 is 0.0 in float32) keeps only it
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()
