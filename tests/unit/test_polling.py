"""The tests' shared deadline poll: what it returns, what it tolerates, how it fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.polling import wait_until


def answers(*values: object) -> Iterator[object]:
    yield from values


def test_returns_the_first_truthy_value() -> None:
    seen = answers(None, 0, "", "ready", "later")
    assert wait_until("a value", lambda: next(seen), timeout=5, interval=0) == "ready"


def test_a_tolerated_exception_means_not_yet_rather_than_done() -> None:
    outcomes = iter([LookupError("not created yet"), LookupError("still not"), "created"])

    def check() -> object:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    tolerated = wait_until("creation", check, timeout=5, interval=0, tolerate=lambda e: isinstance(e, LookupError))
    assert tolerated == "created"


def test_an_exception_not_tolerated_propagates_at_once() -> None:
    calls = 0

    def check() -> bool:
        nonlocal calls
        calls += 1
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        wait_until("anything", check, timeout=5, interval=0, tolerate=lambda e: isinstance(e, LookupError))
    assert calls == 1


def test_the_deadline_failure_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last value: 0"):
        wait_until("the answer", lambda: 0, timeout=0.05, interval=0.01)
