"""What this gateway replica saw of its requests, for the console: the latest slow or failed ones (a bounded
ring) and, per model, a sliding window of outcomes for request rate, error rate and TTFT p95.

Both are kept per feature (namespace and name, as routed): a key sees only its features' requests, and one
feature's traffic never pushes another's out. With one ring for all, a team that failed 100 requests of its
own flushed every other team's recent failures from their consoles; with one window per AIModel, a key given
one feature of a model saw the traffic of the model's other features too.

In this process's memory only: every replica sees its own share of the traffic, and the console says so.
Pure (no framework); the forwarding code calls add() once per finished request.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from servlane_api.targets import parse_target

DEFAULT_SLOW_SECONDS = 10.0
DEFAULT_RING_SIZE = 100
DEFAULT_WINDOW_SECONDS = 300.0
# Per model, at most this many outcomes are kept in the window: a busy replica's memory stays bounded (the
# rates then cover a shorter span, which window_seconds() reports).
MAX_OUTCOMES_PER_MODEL = 20_000
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class RecentRequest:
    time: float  # Unix seconds when it ended
    namespace: str
    feature: str
    model: str  # "" when no backend was reached
    status: int
    seconds: float
    error: str | None  # a stream's failure (cut, errored) or the gateway's reason, else None
    trace_id: str | None
    failed: bool
    slow: bool


@dataclass(frozen=True)
class ModelStats:
    requests: int
    requests_per_second: float
    error_rate: float | None  # None without requests
    ttft_p95_seconds: float | None
    window_seconds: float


def is_failure(status: int, error: str | None) -> bool:
    """Server-side failures: 5xx, and streams that were cut or errored. A client leaving (499) or a refused
    request (4xx) is not the backend failing."""
    return status != CLIENT_CLOSED and (status >= 500 or error is not None)


class OutcomeWindow:
    """One model's latest outcomes (end time, failed, TTFT), oldest first, at most `capacity`.

    Kept in flat arrays of machine numbers, not an object per request: a busy replica holds tens of thousands
    of outcomes for minutes, and as objects every full collection of the cyclic garbage collector walked them
    all (17 ms pauses at the median under 64 clients, 4 ms with arrays), a pause every open stream feels."""

    def __init__(self, capacity: int, initial: int = 64) -> None:
        self.capacity = capacity
        # The arrays grow (doubling) up to `capacity` as outcomes come: a window per feature and model is made
        # for every pair that serves a request, and a tenant makes as many features as it likes.
        self._size = max(1, min(capacity, initial))
        self._times = array("d", bytes(8 * self._size))
        self._ttfts = array("d", bytes(8 * self._size))  # NaN: failed, or no first token seen
        self._failed = array("b", bytes(self._size))
        self._start = 0  # index of the oldest
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def full(self) -> bool:
        return self._count == self.capacity

    def add(self, time: float, failed: bool, ttft: float | None) -> None:
        """Append, dropping the oldest when full."""
        if self._count == self._size < self.capacity:
            self._grow()
        at = (self._start + self._count) % self._size
        self._times[at] = time
        self._failed[at] = failed
        self._ttfts[at] = math.nan if ttft is None else ttft
        if self._count == self._size:
            self._start = (self._start + 1) % self._size
        else:
            self._count += 1

    def _grow(self) -> None:
        """Twice the room (at most `capacity`), the outcomes kept in order from index 0."""
        size = min(self.capacity, 2 * self._size)
        start, extra = self._start, size - self._size
        self._times = self._times[start:] + self._times[:start] + array("d", bytes(8 * extra))
        self._ttfts = self._ttfts[start:] + self._ttfts[:start] + array("d", bytes(8 * extra))
        self._failed = self._failed[start:] + self._failed[:start] + array("b", bytes(extra))
        self._start, self._size = 0, size

    def expire(self, before: float) -> None:
        """Drop the outcomes that ended before `before`."""
        while self._count and self._times[self._start] < before:
            self._start = (self._start + 1) % self._size
            self._count -= 1

    def oldest_time(self) -> float | None:
        return self._times[self._start] if self._count else None

    def _indexes(self) -> range:
        return range(self._start, self._start + self._count)

    def failures(self) -> int:
        return sum(self._failed[i % self._size] for i in self._indexes())

    def ttfts(self) -> list[float]:
        """The TTFTs of the successes that saw a first token."""
        values = (self._ttfts[i % self._size] for i in self._indexes())
        return [value for value in values if not math.isnan(value)]


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


# Which features a reader may see: (namespace, feature name) -> bool; None sees all.
Visible = Callable[[str, str], bool] | None


class RequestLog:
    def __init__(
        self,
        slow_seconds: float = DEFAULT_SLOW_SECONDS,
        size: int = DEFAULT_RING_SIZE,
        window: float = DEFAULT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.time,
        max_outcomes: int = MAX_OUTCOMES_PER_MODEL,
    ) -> None:
        self.slow_seconds = slow_seconds
        self.window = window
        self.clock = clock
        self.started = clock()
        self.size = size
        # Per (namespace, feature); ("", "") holds the requests that never resolved to a route.
        self._rings: dict[tuple[str, str], deque[RecentRequest]] = {}
        self.max_outcomes = max_outcomes
        # Per (namespace, feature, AIModel).
        self._outcomes: dict[tuple[str, str, str], OutcomeWindow] = {}
        self._swept_at = self.started

    def add(
        self,
        namespace: str,
        feature: str,
        model: str,
        status: int,
        seconds: float,
        error: str | None = None,
        trace_id: str | None = None,
        ttft: float | None = None,
    ) -> None:
        now = self.clock()
        failed = is_failure(status, error)
        slow = seconds >= self.slow_seconds
        if failed or slow:
            where = (namespace, feature) if feature else ("", "")
            ring = self._rings.get(where)
            if ring is None:
                ring = self._rings[where] = deque(maxlen=self.size)
            ring.append(RecentRequest(now, namespace, feature, model, status, seconds, error, trace_id, failed, slow))
        if model:
            # An adapter's traffic (`model:adapter`) is its AIModel's: the console lists AIModels.
            key = (namespace, feature, parse_target(model).model)
            outcomes = self._outcomes.get(key)
            if outcomes is None:
                outcomes = self._outcomes[key] = OutcomeWindow(self.max_outcomes)
            outcomes.add(now, failed, ttft if not failed else None)
            outcomes.expire(now - self.window)
        if now - self._swept_at >= self.window:
            self._drop_idle_windows(now)

    def _drop_idle_windows(self, now: float) -> None:
        """Forgets the windows with nothing left in them: a feature with no requests for a whole window would
        otherwise keep its window (and a place in every stats() walk) for the life of the process."""
        self._swept_at = now
        for key, outcomes in list(self._outcomes.items()):
            outcomes.expire(now - self.window)
            if not len(outcomes):
                del self._outcomes[key]

    def features_held(self) -> set[tuple[str, str]]:
        """The (namespace, feature) pairs this log holds a ring or a window for."""
        return set(self._rings) | {(namespace, feature) for namespace, feature, _ in self._outcomes}

    def keep_only(self, live: Callable[[str, str], bool]) -> None:
        """Forgets the features `live` no longer answers for (deleted ones): a tenant that makes and deletes
        AIFeatures would otherwise fill every gateway worker's memory with their rings and windows. Called with
        each new route table; the ring of requests that resolved to no route stays."""
        self._rings = {where: ring for where, ring in self._rings.items() if where == ("", "") or live(*where)}
        self._outcomes = {key: outcomes for key, outcomes in self._outcomes.items() if live(key[0], key[1])}

    def recent(self, visible: Visible = None) -> list[RecentRequest]:
        """The newest `size` of the features `visible` allows (the unresolved ones only to a reader who sees
        all), newest first."""
        rings = [
            ring
            for (namespace, feature), ring in self._rings.items()
            if visible is None or (feature and visible(namespace, feature))
        ]
        newest = heapq.merge(*(reversed(ring) for ring in rings), key=lambda r: r.time, reverse=True)
        return list(itertools.islice(newest, self.size))

    def stats(self, namespace: str, model: str, visible: Visible = None) -> ModelStats:
        """The AIModel's outcomes in the window, through the features `visible` allows."""
        now = self.clock()
        windows = [
            outcomes
            for (of_namespace, feature, of_model), outcomes in self._outcomes.items()
            if of_namespace == namespace and of_model == model and (visible is None or visible(namespace, feature))
        ]
        # A replica up for less than the window has seen less than the window: rates over what it saw.
        seen = max(1e-9, min(self.window, now - self.started))
        count = failures = 0
        rate, span, ttfts = 0.0, seen, []
        for outcomes in windows:
            outcomes.expire(now - self.window)
            covered = seen
            oldest = outcomes.oldest_time()
            if outcomes.full() and oldest is not None:  # a busy feature's window holds less than the window
                covered = max(1e-9, now - oldest)
            count += len(outcomes)
            failures += outcomes.failures()
            rate += len(outcomes) / covered
            span = min(span, covered)
            ttfts += outcomes.ttfts()
        return ModelStats(
            requests=count,
            requests_per_second=rate,
            error_rate=failures / count if count else None,
            ttft_p95_seconds=p95(ttfts),
            window_seconds=span,
        )
