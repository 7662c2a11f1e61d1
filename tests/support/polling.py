"""The tests' one way to wait: poll a check under a deadline, never a bare sleep.

Every harness (runtime, gateway, standalone, Prometheus, e2e) waits through `wait_until`, so a timeout
always fails the same way: with what was awaited and the last value the check returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _nothing_tolerated(_exc: Exception) -> bool:
    return False


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.05,
    tolerate: Callable[[Exception], bool] = _nothing_tolerated,
) -> T:
    """Calls `check` until it returns something truthy, and returns that.

    An exception that `tolerate` accepts counts as "not yet" (e.g. a 404 while an object is being
    created); any other propagates at once. At the deadline, fails with `what` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
        except Exception as exc:
            if not tolerate(exc):
                raise
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)  # the polling interval of a deadline-bounded wait
