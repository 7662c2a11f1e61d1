"""Metrics of gateway worker processes: what prometheus_client's multiprocess mode leaves to its user.

A worker that died leaves its files in the multiprocess directory: its counters rightly stay in the sums (a counter
never goes down), its "live" gauges (in-flight requests) must not, so the worker answering a scrape drops the live
files of processes that no longer run (prometheus_client's mark_process_dead, which nothing called before).

Each update is written to this process's file at once (so a scrape counts every request answered before it),
without prometheus_client's fork check: its values call os.getpid() on every update, a system call per
observation (~12 per request), to notice a fork after the values were made. Workers are spawned, never forked, so
the pid is read once (`values_without_fork_check`).

Tried and taken back (docs/benchmarks.md): values kept in each worker's memory and written to the
files once a second cost 0.92x CPU per request, but a scrape right after a request served by another worker did
not count it yet (e2e/test_namespaces.py): a scrape must count every request answered before it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead

_LIVE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def forget_dead_workers(directory: str | Path) -> list[int]:
    """Removes the live gauges' files of processes that no longer run; returns their pids."""
    dead = []
    for path in Path(directory).iterdir():
        match = _LIVE_FILE.match(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _running(pid):
            mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
            dead.append(pid)
    return sorted(set(dead))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")  # a zombie (not yet reaped by the supervisor) serves nothing


def values_without_fork_check(directory: str | Path) -> bool:
    """Makes the values created from now on write this process's files without calling os.getpid() per update
    (prometheus_client's documented `process_identifier`). Only before this process made any value: two value
    classes would each open the same file and write new series over each other's. False (nothing changed) when
    this process has files already."""
    pid = os.getpid()
    if any(Path(directory).glob(f"*_{pid}.db")):
        return False
    values.ValueClass = values.MultiProcessValue(process_identifier=lambda: pid)  # type: ignore[no-untyped-call]
    return True
