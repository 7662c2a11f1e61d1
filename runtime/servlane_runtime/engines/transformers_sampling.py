"""The transformers engine's sampling, on torch tensors: OpenAI's presence and frequency penalties, greedy or
top-p sampling with logprobs, and xgrammar's mask for structured outputs (Guide)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from .base import RequestNotSupported, SamplingOptions, TokenLogprob

# vLLM raises a temperature in (0, 0.01) to 0.01: below it logits / temperature overflows to inf and NaN.
MIN_TEMPERATURE = 1e-2


def unseeded() -> int:
    """A seed for a request that gave none. Not torch.seed(): that reseeds torch's global generators of every
    device type (formatting a stack trace for the lazy ones), 0.2 ms of a request's time to first token."""
    return random.getrandbits(64)


def sample(
    logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator, token_text: Callable[[int], str]
) -> tuple[int, TokenLogprob | None]:
    """The next token (greedy at temperature 0, else top-p sampling) and, when asked, its logprob and the
    `options.logprobs` likeliest alternatives (OpenAI's meaning).

    Nothing here sorts the whole vocabulary or runs torch.multinomial: on a CPU those cost 13 and 3 ms per token
    at a 152k vocabulary, on the engine's one thread (see draw_top_p and draw)."""
    if options.temperature <= 0:
        token = int(torch.argmax(logits))
    else:
        scaled = logits / max(options.temperature, MIN_TEMPERATURE)
        if options.top_p < 1.0:
            token = draw_top_p(scaled, options.top_p, generator)
        else:
            token = draw(torch.softmax(scaled, dim=-1), generator)
    if options.logprobs is None:
        return token, None
    logprobs = torch.log_softmax(logits, dim=-1)
    top: tuple[tuple[str, float], ...] = ()
    if options.logprobs > 0:
        values, ids = torch.topk(logprobs, options.logprobs)
        top = tuple((token_text(int(i)), float(v)) for v, i in zip(values, ids, strict=True))
    return token, TokenLogprob(token_text(token), float(logprobs[token]), top)


_FIRST_NUCLEUS = 64  # candidates looked at first; a peaked distribution's nucleus is a handful of tokens
# A wide nucleus is drawn from by rejection when each draw is accepted with at least this chance (the set's mass
# is >= top_p), at most _MAX_REJECTIONS times (then the exact, sorting, way: 1 in 10^4 at top_p 0.25).
_REJECTION_MIN_TOP_P = 0.25
_MAX_REJECTIONS = 32


def draw_top_p(scaled: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """A token drawn from the top-p set of softmax(scaled), in proportion to its probability.

    A nucleus within the first _FIRST_NUCLEUS candidates is found exactly (topk). A wider one (a flat
    distribution: a high temperature, random weights) is drawn from by rejection, without sorting the
    vocabulary: draw from the whole distribution until the token is in the set, i.e. the mass of the tokens
    likelier than it is below top_p. Accepted draws follow the set's probabilities exactly, and each is
    accepted with the set's mass (>= top_p)."""
    every = torch.softmax(scaled, dim=-1)
    widest = _FIRST_NUCLEUS if top_p >= _REJECTION_MIN_TOP_P else scaled.shape[-1]
    found = _nucleus_within(scaled, top_p, every, widest)
    if found is None:
        cumulative = torch.cumsum(every, dim=-1)
        for _ in range(_MAX_REJECTIONS):
            token = _draw_cumulative(cumulative, every, generator)
            if float((every * (every > every[token])).sum()) < top_p:
                return token
    ids, probs = found or nucleus(scaled, top_p, every)
    return int(ids[draw(probs, generator)])


def _kept(probs: torch.Tensor, top_p: float) -> int:
    """How many of `probs` (likeliest first) the top-p set keeps: those with less than top_p before them."""
    keep = torch.cumsum(probs, dim=-1) - probs < top_p
    keep[0] = True  # a tiny top_p (5e-324 is 0.0 in float32) keeps only the likeliest
    return int(keep.sum())


def nucleus(scaled: torch.Tensor, top_p: float, every: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p set of softmax(scaled) (`every`, when already computed), likeliest first, as (token ids, their
    probabilities): the smallest prefix of the tokens by probability whose mass reaches top_p (the likeliest
    always kept). The same set a sort of the whole vocabulary gives."""
    every = torch.softmax(scaled, dim=-1) if every is None else every
    found = _nucleus_within(scaled, top_p, every, scaled.shape[-1])
    assert found is not None, "within the whole vocabulary the set is always found"
    return found


def _nucleus_within(
    scaled: torch.Tensor, top_p: float, every: torch.Tensor, widest: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-p set from topk of growing size (it is within the first k candidates unless all k are in it);
    None when it is wider than `widest` candidates."""
    vocab = scaled.shape[-1]
    k = min(_FIRST_NUCLEUS, vocab)
    while True:
        ids = torch.topk(scaled, k).indices
        probs = every[ids]
        kept = _kept(probs, top_p)
        if kept < k or k == vocab:
            return ids[:kept], probs[:kept]
        if k >= widest:
            return None
        k = min(k * 8, vocab)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """An index drawn with probability proportional to `probs` (not necessarily normalised): one uniform
    number from `generator` against their cumulative sum."""
    return _draw_cumulative(torch.cumsum(probs, dim=-1), probs, generator)


def _draw_cumulative(cumulative: torch.Tensor, probs: torch.Tensor, generator: torch.Generator) -> int:
    total = float(cumulative[-1])
    if not math.isfinite(total) or total <= 0:
        # A broken model (NaN weights from a bad conversion): fail the request loudly, as torch.multinomial did,
        # rather than draw a token from garbage. A canary of such a model then fails and is rolled back.
        raise RuntimeError(f"the model's next-token probabilities are not finite (sum {total}): it cannot be sampled")
    u = torch.rand(1, generator=generator, device=generator.device, dtype=cumulative.dtype) * total
    index = min(int(torch.searchsorted(cumulative, u, right=True)), probs.shape[-1] - 1)
    while index > 0 and probs[index] <= 0:  # u rounded up onto the end: the last token with any mass
        index -= 1
    return index


class Guide:
    """One generation's xgrammar matcher: masks what the grammar forbids next, follows what was sampled."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar

        self._xgr = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)

    def allows_nothing(self) -> bool:
        """Whether the grammar forbids every token next: a schema no value matches (a `$ref` to itself, a
        pattern no string matches) compiles, and then leaves nothing to sample."""
        if self._matcher.is_terminated():
            return False
        self._matcher.fill_next_token_bitmask(self._bitmask)
        return not bool(self._bitmask.any())

    def mask(self, logits: torch.Tensor) -> None:
        """Sets what the grammar forbids next to -inf; RequestNotSupported when it forbids every token: sampling
        all -inf drew from NaN (an error the client could not act on) and greedy decoding took token 0."""
        if self.allows_nothing():
            raise RequestNotSupported(
                "the JSON schema admits no continuation of the output so far: no value can match it",
                param="response_format",
            )
        if self._matcher.is_terminated():
            return
        self._xgr.apply_token_bitmask_inplace(logits.view(1, -1), self._bitmask.to(logits.device))

    def accept(self, token: int) -> None:
        if not self._matcher.is_terminated():
            self._matcher.accept_token(token)


def penalised(logits: torch.Tensor, counts: Counter[int], options: SamplingOptions) -> torch.Tensor:
    """OpenAI's penalties (subtract presence once and frequency per occurrence of each seen token) and its
    logit_bias (added to its tokens' logits, before any sampling, as OpenAI and vLLM apply it)."""
    penalties = bool(counts) and (options.presence_penalty != 0 or options.frequency_penalty != 0)
    if not penalties and not options.logit_bias:
        return logits
    logits = logits.clone()
    if penalties:
        ids = torch.tensor(list(counts.keys()), device=logits.device)
        freq = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
        logits[ids] -= options.presence_penalty + options.frequency_penalty * freq
    if options.logit_bias:
        biased = torch.tensor([token for token, _ in options.logit_bias], device=logits.device)
        logits[biased] += torch.tensor(
            [bias for _, bias in options.logit_bias], dtype=logits.dtype, device=logits.device
        )
    return logits
