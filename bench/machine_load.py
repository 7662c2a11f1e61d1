"""How busy the machine was while a cell ran: the share of CPU time the hypervisor gave to other guests
(steal) and the share left idle, from /proc/stat's aggregate `cpu` line. On a shared VM steal comes and
goes by the minute, and both sides of a comparison lose to it; recorded per round so a reader can see it."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int]:
    """The aggregate CPU time counters (clock ticks since boot); empty where /proc/stat is missing."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0]
    except OSError:
        return {}
    values = [int(v) for v in line.split()[1 : 1 + len(_FIELDS)]]
    return dict(zip(_FIELDS, values, strict=False))


def shares(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Each counter's share of the time between two readings, e.g. {"steal": 0.45, "idle": 0.18, ...}."""
    deltas = {name: after.get(name, 0) - before.get(name, 0) for name in _FIELDS}
    total = sum(deltas.values())
    if total <= 0:
        return {}
    return {name: round(delta / total, 3) for name, delta in deltas.items()}


def steal_summary(runs: Iterable[dict[str, object]]) -> str | None:
    """The line a result table ends with: the steal over the runs that recorded `cpu_shares` (None: none did)."""
    steal = [float(shares["steal"]) for run in runs if isinstance(shares := run.get("cpu_shares"), dict) and shares]
    if not steal:
        return None
    return (
        f"CPU steal while measuring: median {statistics.median(steal):.0%} "
        f"({min(steal):.0%}-{max(steal):.0%}) over {len(steal)} runs"
    )
