"""The engines' sampler (transformers_sampling): the top-p set found without sorting the vocabulary is the set a
full sort gives; draws follow the probabilities; greedy, seeds and logprobs keep their meaning."""

from __future__ import annotations

import math

import pytest
import torch

from servlane_runtime.engines.base import SamplingOptions
from servlane_runtime.engines.transformers_sampling import draw, draw_top_p, nucleus, sample


def sorted_nucleus(scaled: torch.Tensor, top_p: float) -> set[int]:
    """The reference: sort the whole vocabulary, keep the prefix whose mass before each token is < top_p."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    keep[0] = True
    return {int(i) for i in order[keep]}


def _logits(kind: str, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "peaked":  # a trained model's usual next-token distribution: a few likely tokens
        return torch.randn(vocab, generator=g) * 4.0
    if kind == "flat":  # random weights: nearly uniform, the nucleus is most of the vocabulary
        return torch.randn(vocab, generator=g) * 0.01
    if kind == "one":  # one token holds nearly all the mass
        logits = torch.randn(vocab, generator=g)
        logits[vocab // 3] = 40.0
        return logits
    if kind == "masked":  # a grammar allowed 100 tokens only
        logits = torch.full((vocab,), float("-inf"))
        allowed = torch.randperm(vocab, generator=g)[:100]
        logits[allowed] = torch.randn(len(allowed), generator=g)
        return logits
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["peaked", "flat", "one", "masked"])
@pytest.mark.parametrize("top_p", [5e-324, 0.5, 0.9, 0.999999])
@pytest.mark.parametrize("vocab", [7, 1000, 32000])
def test_nucleus_is_the_set_a_full_sort_gives(kind: str, top_p: float, vocab: int) -> None:
    for seed in range(2):
        scaled = _logits(kind, vocab, seed)
        ids, probs = nucleus(scaled, top_p)
        assert {int(i) for i in ids} == sorted_nucleus(scaled, top_p)
        assert torch.all(probs[:-1] >= probs[1:]), "likeliest first"
        assert torch.allclose(probs, torch.softmax(scaled, dim=-1)[ids], atol=1e-6)


def test_a_tiny_top_p_keeps_only_the_likeliest_token() -> None:
    scaled = _logits("flat", 32000, 0)
    ids, _ = nucleus(scaled, 5e-324)
    assert ids.tolist() == [int(torch.argmax(scaled))]


def test_draws_follow_the_probabilities() -> None:
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    generator = torch.Generator().manual_seed(7)
    n = 20000
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(n)]), minlength=len(probs))
    assert counts[1] == 0, "a token without mass is never drawn"
    assert counts[5] == 0, "not even the last one"
    for index, p in enumerate(probs.tolist()):
        if p > 0:  # within 5 standard deviations of a binomial count
            assert abs(int(counts[index]) - n * p) < 5 * math.sqrt(n * p * (1 - p)), (index, counts.tolist())


def test_draw_takes_unnormalised_mass_and_never_a_trailing_empty_token() -> None:
    probs = torch.tensor([2.0, 6.0, 0.0, 0.0])
    generator = torch.Generator().manual_seed(1)
    drawn = [draw(probs, generator) for _ in range(4000)]
    assert set(drawn) == {0, 1}
    assert 0.7 < drawn.count(1) / len(drawn) < 0.8


@pytest.mark.parametrize(
    ("kind", "vocab", "top_p"),
    [
        ("peaked", 32000, 0.9),  # a nucleus within the first candidates: found exactly
        ("flat", 2000, 0.9),  # a wide one: drawn by rejection
        ("flat", 20_000, 0.005),  # wide, but a draw from the whole rarely hits it: the exact way
    ],
)
def test_top_p_draws_come_from_the_set_in_proportion(kind: str, vocab: int, top_p: float) -> None:
    scaled = _logits(kind, vocab, 11)
    allowed = sorted_nucleus(scaled, top_p)
    generator = torch.Generator().manual_seed(3)
    n = 2000 if top_p > 0.5 else 300
    drawn = [draw_top_p(scaled, top_p, generator) for _ in range(n)]
    assert set(drawn) <= allowed
    # The likelier half of the set's mass, by the reference's probabilities, is drawn about half the time.
    probs = torch.softmax(scaled, dim=-1)
    ordered = sorted(allowed, key=lambda t: -float(probs[t]))
    mass = torch.cumsum(probs[ordered], dim=-1)
    upper = set(ordered[: int(torch.searchsorted(mass, mass[-1] / 2)) + 1])
    expected = float(probs[list(upper)].sum() / mass[-1])
    observed = sum(t in upper for t in drawn) / n
    assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / n) + 1e-9, (observed, expected)


def test_sampling_draws_from_the_nucleus_only() -> None:
    scaled = _logits("peaked", 32000, 3)
    allowed = sorted_nucleus(scaled, 0.5)
    generator = torch.Generator().manual_seed(0)
    options = SamplingOptions(max_tokens=1, temperature=1.0, top_p=0.5)
    drawn = {sample(scaled, options, generator, str)[0] for _ in range(500)}
    assert drawn <= allowed
    assert len(drawn) > 1 or len(allowed) == 1


def test_the_same_seed_draws_the_same_tokens() -> None:
    logits = _logits("flat", 32000, 5)
    for top_p in (1.0, 0.9):
        options = SamplingOptions(max_tokens=1, temperature=0.7, top_p=top_p)
        runs = []
        for _ in range(2):
            generator = torch.Generator().manual_seed(1234)
            runs.append([sample(logits, options, generator, str)[0] for _ in range(50)])
        assert runs[0] == runs[1]
        assert len(set(runs[0])) > 10, "a flat distribution gives many tokens"


def test_greedy_takes_the_argmax_and_logprobs_are_of_the_raw_logits() -> None:
    logits = _logits("peaked", 1000, 9)
    options = SamplingOptions(max_tokens=1, temperature=0.0, logprobs=3)
    token, logprob = sample(logits, options, torch.Generator(), lambda t: f"t{t}")
    assert token == int(torch.argmax(logits))
    assert logprob is not None
    reference = torch.log_softmax(logits, dim=-1)
    assert logprob.token == f"t{token}"
    assert logprob.logprob == pytest.approx(float(reference[token]))
    values, ids = torch.topk(reference, 3)
    assert [name for name, _ in logprob.top] == [f"t{int(i)}" for i in ids]
    assert [value for _, value in logprob.top] == pytest.approx(values.tolist())


def test_without_logprobs_none_are_computed() -> None:
    options = SamplingOptions(max_tokens=1, temperature=0.8, top_p=0.9)
    _, logprob = sample(_logits("peaked", 1000, 1), options, torch.Generator().manual_seed(0), str)
    assert logprob is None


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.1])
def test_a_model_with_nan_logits_cannot_be_sampled_from(top_p: float) -> None:
    """A broken checkpoint (NaN weights) fails every sampled request loudly, as torch.multinomial did, so its
    canary fails and is rolled back; a greedy pick still returns a token (the runtime's warm-up is greedy)."""
    logits = torch.full((1000,), float("nan"))
    options = SamplingOptions(max_tokens=1, temperature=1.0, top_p=top_p)
    with pytest.raises(RuntimeError, match="not finite"):
        sample(logits, options, torch.Generator().manual_seed(0), str)
    greedy, _ = sample(logits, SamplingOptions(max_tokens=1, temperature=0.0), torch.Generator(), str)
    assert 0 <= greedy < 1000
