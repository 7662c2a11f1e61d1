"""Prompts kept in host memory once their sequence is given to another request, as llama-server's prompt cache
(--cache-ram, on by default) keeps them: a request that starts like one served earlier gets that start's KV
state copied back (a memcpy) instead of reading its prompt again (a forward pass per token).

Bookkeeping only, so it is table-tested without llama.cpp: which entry serves a prompt, what is kept, what is
evicted (the least recently used first, within a byte budget). The engine moves the bytes
(llama_state_seq_get_data / _set_data).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .llamacpp_batches import common_start

# Shorter starts are not worth a state copy: reading a few tokens costs about what restoring them does.
MIN_CACHED_TOKENS = 16


@dataclass(frozen=True)
class CachedPrompt:
    tokens: tuple[int, ...]  # what the state holds, in order
    state: bytearray  # the sequence's KV state, as llama_state_seq_get_data wrote it (llama.cpp reads it in place)


class PromptCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], CachedPrompt] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: Sequence[int]) -> tuple[CachedPrompt | None, int]:
        """The entry sharing the longest start with `prompt`, and how many of its tokens serve it (never the
        prompt's last: its logits give the first completion token). (None, 0) when none shares enough."""
        found, reused = None, 0
        for entry in self._entries.values():
            common = min(common_start(entry.tokens, prompt), len(prompt) - 1)
            if common > reused:
                found, reused = entry, common
        if found is None or reused < MIN_CACHED_TOKENS:
            return None, 0
        self._entries.move_to_end(found.tokens)
        return found, reused

    def wants(self, tokens: Sequence[int]) -> bool:
        """Whether a sequence holding `tokens` is worth saving before it is overwritten: long enough, and not
        already held by an entry (the same tokens, or more that start with them)."""
        if self.budget_bytes == 0 or len(tokens) < MIN_CACHED_TOKENS:
            return False
        return not any(common_start(e.tokens, tokens) == len(tokens) for e in self._entries.values())

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        """Keep `state` (of `tokens`): entries it extends go (it serves whatever they served), then the least
        recently used until it fits. A state larger than the whole budget is not kept."""
        key = tuple(tokens)
        if not self.wants(key) or len(state) > self.budget_bytes:
            return
        for old in [e for e in self._entries.values() if common_start(e.tokens, key) == len(e.tokens)]:
            self._drop(old.tokens)
        while self._entries and self.bytes + len(state) > self.budget_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = CachedPrompt(key, state)
        self.bytes += len(state)

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes -= len(self._entries.pop(key).state)
