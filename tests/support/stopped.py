"""A process frozen with SIGSTOP, for tests that need one alive but doing nothing: `os.kill` returns once the
signal is sent, but the process stops only when one of its threads takes it; until then its other threads go on
(accepting a connection, answering a datagram). So each freeze waits until every thread says it is stopped."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.polling import wait_until


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (`T` in /proc/<pid>/task/<tid>/stat)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return bool(states) and all(state == "T" for state in states)


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid`, and wait until it is stopped indeed."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(f"process {pid} stopped", lambda: all_threads_stopped(pid), timeout=timeout, interval=0.005)
