"""Outlier detection: endpoints that keep failing are ejected for a while (Envoy's consecutive errors).

A failure is a connection refused, not accepted in time or reset before any answer, or a 5xx from the pod
itself; any other answer is a success and clears the count. CONSECUTIVE failures in a row eject the
endpoint for base * (times ejected), at most max seconds: a pod that keeps failing stays out longer each
time, and one that recovers comes back after the base time. The count of ejections shrinks by one for
each stretch of healthy time as long as the base time. Never the last: a failure does not eject an endpoint
when no other endpoint of its group (the version's eligible pods) is left that is not ejected (it keeps counting,
and goes out when another one is back).

Pure: the caller passes the clock (`now`, monotonic seconds) and the group.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

CONSECUTIVE = 3
BASE_EJECTION_SECONDS = 5.0
MAX_EJECTION_SECONDS = 300.0


@dataclass(frozen=True)
class OutlierRules:
    consecutive: int = CONSECUTIVE
    base_seconds: float = BASE_EJECTION_SECONDS
    max_seconds: float = MAX_EJECTION_SECONDS


@dataclass
class _State:
    failures: int = 0
    ejections: int = 0
    until: float = float("-inf")  # ejected while now < until
    healthy_since: float = float("-inf")  # when the ejection count last shrank or the endpoint came back


class OutlierDetector:
    def __init__(self, rules: OutlierRules | None = None) -> None:
        self.rules = rules or OutlierRules()
        self._states: dict[str, _State] = {}

    def is_ejected(self, address: str, now: float) -> bool:
        state = self._states.get(address)
        return state is not None and now < state.until

    def ejected(self, addresses: Iterable[str], now: float) -> set[str]:
        return {a for a in addresses if self.is_ejected(a, now)}

    def record_success(self, address: str, now: float) -> None:
        state = self._states.get(address)
        if state is None:
            return
        state.failures = 0
        if state.ejections and now >= state.until:
            state.healthy_since = max(state.healthy_since, state.until)
            periods = int((now - state.healthy_since) // self.rules.base_seconds)
            if periods:
                state.ejections = max(0, state.ejections - periods)
                state.healthy_since = now
        if not state.ejections:
            del self._states[address]

    def record_failure(self, address: str, group: Collection[str], now: float) -> bool:
        """Counts a failure; True when it ejects the endpoint. `group`: the addresses of the endpoint's
        eligible peers (itself included or not)."""
        state = self._states.setdefault(address, _State())
        if now < state.until:
            return False  # a request sent before the ejection: already counted
        state.failures += 1
        if state.failures < self.rules.consecutive:
            return False
        if not any(peer != address and not self.is_ejected(peer, now) for peer in group):
            return False  # never the last one standing
        state.ejections += 1
        state.failures = 0
        state.until = now + min(self.rules.base_seconds * state.ejections, self.rules.max_seconds)
        return True

    def forget(self, keep: Collection[str]) -> None:
        """Drop the state of endpoints that are gone (a pod's address may come back as another pod)."""
        for address in [a for a in self._states if a not in keep]:
            del self._states[address]
