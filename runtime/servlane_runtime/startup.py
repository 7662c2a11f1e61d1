"""The runtime's own start, phase by phase (servlane_api.cold_start.RUNTIME_PHASES), as wall-clock times.

Served as JSON at GET /startup on the metrics port and as gauges beside /metrics; the operator puts them
beside what Kubernetes reports of the pod to explain a cold start (status.coldStart).

process_start is the kernel's record of when this process was exec'd, so the interpreter's own start and
the imports before any of our code ran are counted too; the other phases are stamped as they happen.
Each phase is stamped once: a later stamp of the same phase (a second first token) changes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

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
