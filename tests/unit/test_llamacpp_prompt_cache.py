"""The llama.cpp engine's prompt cache: which kept prompt serves a request, what is kept, what goes."""

from __future__ import annotations

from servlane_runtime.engines.llamacpp_prompt_cache import MIN_CACHED_TOKENS, PromptCache

START = list(range(100, 100 + MIN_CACHED_TOKENS))  # a start long enough to be worth keeping


def tokens(*tail: int) -> list[int]:
    return START + list(tail)


def test_the_entry_with_the_longest_start_serves_and_never_the_prompts_last_token() -> None:
    cache = PromptCache(1000)
    cache.put(tokens(1, 2), bytearray(b"a" * 10))
    cache.put(tokens(1, 3, 4), bytearray(b"b" * 10))
    entry, reused = cache.best(tokens(1, 3, 4, 5))
    assert entry is not None
    assert (entry.tokens, entry.state, reused) == (tuple(tokens(1, 3, 4)), bytearray(b"b" * 10), len(START) + 3)
    # The same prompt again: all but its last token, whose logits give the first completion token.
    entry, reused = cache.best(tokens(1, 3, 4))
    assert entry is not None
    assert reused == len(START) + 2


def test_a_start_too_short_to_be_worth_a_copy_is_neither_served_nor_kept() -> None:
    cache = PromptCache(1000)
    cache.put(tokens(1), bytearray(b"s"))
    assert cache.best([*START[:5], 9, 9, 9]) == (None, 0)
    short = list(range(MIN_CACHED_TOKENS - 1))
    assert not cache.wants(short)
    cache.put(short, bytearray(b"x"))
    assert len(cache) == 1


def test_the_least_recently_used_goes_first_within_the_budget() -> None:
    cache = PromptCache(30)
    cache.put(tokens(1), bytearray(b"1" * 10))
    cache.put(tokens(2), bytearray(b"2" * 10))
    cache.put(tokens(3), bytearray(b"3" * 10))
    assert cache.best(tokens(1, 7))[0] is not None  # used: now the most recent
    cache.put(tokens(4), bytearray(b"4" * 10))  # over budget: 2, the least recently used, goes
    served_by = {tail: cache.best(tokens(tail, 0))[0] for tail in (1, 2, 3, 4)}
    kept = {tail for tail, entry in served_by.items() if entry is not None and entry.tokens == tuple(tokens(tail))}
    assert kept == {1, 3, 4}
    assert cache.bytes == 30
    # A state larger than the whole budget is not kept, and evicts nothing.
    cache.put(tokens(5), bytearray(b"5" * 31))
    assert len(cache) == 3


def test_a_longer_prompt_replaces_the_entries_it_starts_with_and_a_held_one_is_not_kept_twice() -> None:
    cache = PromptCache(1000)
    cache.put(tokens(1), bytearray(b"a" * 10))
    cache.put(tokens(1, 2, 3), bytearray(b"b" * 20))  # serves whatever tokens(1) served
    assert len(cache) == 1
    assert cache.bytes == 20
    assert not cache.wants(tokens(1, 2))  # already held, inside a longer entry
    assert cache.wants(tokens(1, 9))


def test_no_budget_keeps_nothing() -> None:
    cache = PromptCache(0)
    assert not cache.wants(tokens(1))
    cache.put(tokens(1), bytearray(b"a"))
    assert cache.best(tokens(1, 2)) == (None, 0)
