"""Which tokens the llama.cpp engine decodes next (llamacpp_batches.plan_batch): generating requests first, one
token each, then prompt chunks, oldest first, within the batch budget; logits only where a token is sampled."""

from __future__ import annotations

from servlane_runtime.engines.llamacpp_batches import Entry, SequenceView, pick_sequence, plan_batch


def generating(sequence: int, token: int, position: int) -> SequenceView:
    return SequenceView(sequence, prompt=[9, 9], read=2, last_token=token, position=position)


def reading(sequence: int, prompt: list[int], read: int = 0) -> SequenceView:
    return SequenceView(sequence, prompt=prompt, read=read, last_token=None, position=read)


def test_every_generating_request_gets_its_newest_token_decoded_with_logits() -> None:
    assert plan_batch([generating(0, 7, 12), generating(3, 8, 5)], budget=4) == [
        Entry(7, 12, 0, True),
        Entry(8, 5, 3, True),
    ]


def test_a_prompt_takes_what_the_generating_requests_leave_and_wants_logits_only_at_its_end() -> None:
    entries = plan_batch([generating(0, 7, 12), reading(1, [1, 2, 3, 4, 5, 6])], budget=4)
    assert entries == [Entry(7, 12, 0, True), Entry(1, 0, 1, False), Entry(2, 1, 1, False), Entry(3, 2, 1, False)]
    # The next step goes on where it stopped, and its last token asks for logits (the first completion token).
    entries = plan_batch([generating(0, 9, 13), reading(1, [1, 2, 3, 4, 5, 6], read=3)], budget=8)
    assert entries[1:] == [Entry(4, 3, 1, False), Entry(5, 4, 1, False), Entry(6, 5, 1, True)]


def test_prompts_are_read_oldest_first_and_the_budget_is_never_exceeded() -> None:
    entries = plan_batch([reading(2, [1, 1, 1]), reading(0, [2, 2, 2, 2])], budget=5)
    assert sorted((e.sequence, e.position, e.wants_logits) for e in entries) == [
        (0, 0, False),
        (0, 1, False),
        (2, 0, False),
        (2, 1, False),
        (2, 2, True),
    ]
    # The older request's prompt is read whole; the younger one's gets what is left.
    assert len(plan_batch([reading(2, [1, 1, 1]), reading(0, [2, 2, 2, 2])], budget=3)) == 3
    assert {e.sequence for e in plan_batch([reading(2, [1, 1, 1]), reading(0, [2, 2, 2, 2])], budget=3)} == {2}


def test_a_batch_is_in_sequence_order_whatever_the_order_of_admission() -> None:
    """llama.cpp splits a batch whose sequence ids do not increase into several graph computations."""
    running = [generating(3, 7, 4), reading(1, [1, 2, 3]), generating(0, 8, 9), generating(2, 9, 6)]
    entries = plan_batch(running, budget=8)
    assert [(e.sequence, e.position) for e in entries] == [(0, 9), (1, 0), (1, 1), (1, 2), (2, 6), (3, 4)]
    assert [e.token for e in entries] == [8, 1, 2, 3, 9, 7]


def test_nothing_to_read_and_nothing_generated_is_nothing_to_decode() -> None:
    assert plan_batch([reading(0, [1, 2], read=2)], budget=8) == []
    assert plan_batch([], budget=8) == []


def test_a_request_gets_the_free_sequence_holding_the_longest_start_of_its_prompt() -> None:
    cached = {0: [1, 2, 9], 1: [1, 2, 3, 4, 5], 2: [7]}
    assert pick_sequence([0, 1, 2], cached, [1, 2, 3, 4, 8]) == (1, 4)
    assert pick_sequence([0, 2], cached, [1, 2, 3, 4, 8]) == (0, 2)  # the best one is busy
    # Nothing shared: the lowest free one (running sequences stay consecutive), all read afresh.
    assert pick_sequence([3, 0], cached, [5, 5]) == (0, 0)
    assert pick_sequence([3, 2], {3: [1, 2, 3], 2: [1, 2, 4]}, [1, 2, 5]) == (2, 2)  # as good as 3: the lower one


def test_the_last_prompt_token_is_always_decoded_again_for_its_logits() -> None:
    assert pick_sequence([1], {1: [1, 2, 3, 4, 5]}, [1, 2, 3]) == (1, 2)
    assert pick_sequence([1], {1: [1, 2, 3]}, [1, 2, 3]) == (1, 2)
    assert pick_sequence([1], {1: [1]}, [1]) == (1, 0)
