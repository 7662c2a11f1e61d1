"""Child processes the supervisor owns: each in its own process group, stopped with a deadline.

Why process groups: a runtime may start helpers of its own (tokenizer or engine workers). SIGTERM to
the group lets uvicorn drain, SIGKILL to the group after the deadline leaves nothing behind. On Linux
the child also gets PR_SET_PDEATHSIG, so a supervisor killed with SIGKILL still takes its children down.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None

    def set_pdeathsig() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_pdeathsig


def backoff_seconds(consecutive_failures: int) -> float:
    """1s, 2s, 4s, … up to a minute: a crash loop costs little, a one-off crash recovers fast."""
    return float(min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2.0 ** max(0, consecutive_failures - 1)))


class ManagedProcess:
    """One child: started, watched for exit, restarted by the caller after `restart_at`."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.restarts = 0  # restarts after the process exited on its own
        self.consecutive_failures = 0
        self.last_exit_code: int | None = None
        self.restart_at: float | None = None  # monotonic time of the next start after an exit

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group (and session): signalled as a whole
                preexec_fn=_die_with_parent(),
            )
        self.started_at = time.monotonic()
        self.restart_at = None
        log.debug("%s started, pid %d", self.name, self.process.pid)

    def check_exit(self) -> int | None:
        """The exit code if the process ended since the last check (then it is scheduled to restart)."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            return None
        _kill_group(self.process.pid, signal.SIGKILL)  # anything it left in its group goes too
        self.process = None
        self.last_exit_code = code
        self.consecutive_failures += 1
        self.restart_at = time.monotonic() + backoff_seconds(self.consecutive_failures)
        return code

    def due_for_restart(self, now: float) -> bool:
        return self.process is None and self.restart_at is not None and now >= self.restart_at

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    async def stop(self, deadline_seconds: float) -> None:
        """SIGTERM to the group, SIGKILL when the deadline passes; returns once the process is gone."""
        process, self.process = self.process, None
        self.restart_at = None
        if process is None:
            return
        _kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), deadline_seconds)
        except TimeoutError:
            log.warning("%s did not stop within %.0fs: killing it", self.name, deadline_seconds)
        _kill_group(process.pid, signal.SIGKILL)  # also whatever it started in its group
        await asyncio.to_thread(process.wait)

    def kill_now(self) -> None:
        if self.process is not None:
            _kill_group(self.process.pid, signal.SIGKILL)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
