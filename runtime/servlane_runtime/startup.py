"""The runtime's own start, phase by phase (servlane_api.cold_start.RUNTIME_PHASES), as wall-clock times.

Served as JSON at GET /startup on the metrics port and as gauges beside /metrics; the operator puts them
beside what Kubernetes reports of the pod to explain a cold start (status.coldStart).

process_start is the kernel's record of when this process was exec'd, so the interpreter's own start and
the imports before any of our code ran are counted too; the other phases are stamped as they happen
(first_request by FirstRequestStamp, an ASGI layer in front of the routes).
Each phase is stamped once: a later stamp of the same phase (a second first token) changes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from servlane_api.cold_start import RuntimePhase, RuntimeStartup

log = logging.getLogger(__name__)


def process_start_time(clock: Callable[[], float] = time.time) -> float:
    """When this process was exec'd, as Unix seconds: its age from /proc (in clock ticks since boot)
    taken from now. Where /proc is not there (not Linux), now: the phases after it are still right."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22 (starttime); the command name (field 2) may hold spaces, so count from its ')'.
            started_ticks = int(stat.read().rpartition(")")[2].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return clock()
    return clock() - max(0.0, age)


class StartupClock:
    """The phases reached so far. `on_phase` (e.g. the gauges) hears of each one once, as it is stamped."""

    def __init__(
        self,
        process_start: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._phases: dict[RuntimePhase, float] = {}
        self._listeners: list[Callable[[RuntimePhase, float], None]] = []
        self._phases["process_start"] = process_start if process_start is not None else process_start_time(clock)

    def subscribe(self, listener: Callable[[RuntimePhase, float], None]) -> None:
        """Hear of every phase, those already reached first."""
        self._listeners.append(listener)
        for phase, at in self._phases.items():
            listener(phase, at)

    def mark(self, phase: RuntimePhase) -> None:
        if phase in self._phases:
            return
        at = self._clock()
        self._phases[phase] = at
        log.info("startup phase %s at +%.2fs", phase, at - self._phases["process_start"])
        for listener in self._listeners:
            listener(phase, at)

    def reached(self, phase: RuntimePhase) -> bool:
        return phase in self._phases

    def snapshot(self) -> RuntimeStartup:
        return RuntimeStartup(phases=dict(self._phases))


class FirstRequestStamp:
    """ASGI layer that stamps first_request when the first inference request (a POST under /v1/) arrives on the
    API port after ready, before its body is read: for a model woken from zero, ready -> first_request is how
    long the gateway took to let its held requests go (#30's goal: under 100 ms). Probes, the model list and
    requests turned away while loading are not requests the model served, and are not counted."""

    def __init__(self, app: Callable[..., Awaitable[None]], startup: StartupClock) -> None:
        self.app = app
        self.startup = startup

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith("/v1/")
            and self.startup.reached("ready")
        ):
            self.startup.mark("first_request")
        await self.app(scope, receive, send)
