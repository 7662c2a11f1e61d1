"""Which tokens go into the llama.cpp engine's next decode: pure, so it is table-tested without llama.cpp.

Like llama-server's slots: every running generation contributes its one newest token, and what budget is left
goes to prompts still being read (prefill), oldest request first, in chunks, so a long prompt never stalls the
streams already running for more than one batch.

Order matters to llama.cpp: with a KV stream per sequence (kv_unified off) it computes a batch in micro-batches
of consecutive, increasing sequence ids (llama_batch_allocr::split_equal, sequential). Entries in admission order
(sequences 3, 2, 1, 0) cost four graph computations instead of one: 12.7 against 9.3 ms for 4 tokens of the bench
model. So a batch is in sequence order, and a request takes the lowest free sequence when nothing favours another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceView:
    """What the planner needs of one running request."""

    sequence: int  # its KV cache sequence
    prompt: Sequence[int]
    read: int  # prompt tokens already decoded
    last_token: int | None  # the newest sampled token, not yet decoded (None while the prompt is being read)
    position: int  # the position the next decoded token takes


@dataclass(frozen=True)
class Entry:
    token: int
    position: int
    sequence: int
    wants_logits: bool


def plan_batch(running: Sequence[SequenceView], budget: int) -> list[Entry]:
    """The next decode's entries, in sequence order: each generating sequence's newest token (the budget is never
    below the number of sequences), then prompt chunks up to `budget` in all. A prompt's entry wants logits only
    when it is the last token of the prompt: its logits give the first completion token."""
    entries = [
        Entry(view.last_token, view.position, view.sequence, True) for view in running if view.last_token is not None
    ]
    for view in running:
        left = budget - len(entries)
        if left <= 0:
            break
        if view.last_token is not None or view.read >= len(view.prompt):
            continue
        chunk = view.prompt[view.read : view.read + left]
        for offset, token in enumerate(chunk):
            last = view.read + offset + 1 == len(view.prompt)
            entries.append(Entry(token, view.position + offset, view.sequence, last))
    return sorted(entries, key=lambda e: e.sequence)  # stable: a sequence's tokens stay in position order


def common_start(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their first on."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def pick_sequence(free: Sequence[int], cached: dict[int, list[int]], prompt: Sequence[int]) -> tuple[int, int]:
    """The free sequence whose KV cache shares the longest start with `prompt`, and how many of its tokens are
    reused (as llama-server's slots keep their prompt: chats resend the whole conversation each turn). At least
    the prompt's last token is decoded again: its logits give the first completion token. Between equals, the
    lowest: running sequences stay consecutive, which llama.cpp decodes in one micro-batch (see above)."""
    best, reused = min(free), 0
    for sequence in sorted(free):
        common = min(common_start(cached.get(sequence, []), prompt), len(prompt) - 1)
        if common > reused:
            best, reused = sequence, common
    return best, reused
