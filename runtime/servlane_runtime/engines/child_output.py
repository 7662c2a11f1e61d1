"""The root cause of a failed engine start, read from what the engine's child processes wrote to stderr.

vLLM builds its engine core in a child process; when that fails, the parent only raises "Engine core
initialization failed. See root cause above", and the cause (the child's exception) is in the child's
stderr. `StderrTail` passes this process's stderr, and that of the children it starts meanwhile, through a
pipe that a thread copies to the real stderr (the pod's log keeps every line), remembering the last lines;
`root_cause` finds the exception line in them.
"""

from __future__ import annotations

import collections
import os
import re
import threading

# The last lines kept: a traceback of a failed engine start is some dozens of lines.
TAIL_LINES = 400
# vLLM prefixes its child processes' lines with "(EngineCore_DP0 pid=1234) ".
_PROCESS_PREFIX = re.compile(r"^\((?:[A-Za-z0-9_]+) pid=\d+\)\s?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# An exception's last line: `Name: message` or `package.Name: message` (or a bare name).
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt)\b"
)


def root_cause(lines: list[str]) -> str | None:
    """The exception line that ends the last traceback in `lines` (None when there is none).

    A chained traceback ("During handling ...", "The above exception was the direct cause ...") ends in the
    outermost exception, which for vLLM's engine core is the one it re-raised: the cause.
    """
    clean = [_PROCESS_PREFIX.sub("", _ANSI.sub("", line)).rstrip() for line in lines]
    starts = [i for i, line in enumerate(clean) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    found = None
    for line in clean[starts[-1] + 1 :]:
        if line and not line[0].isspace() and _EXCEPTION_LINE.match(line):
            found = line
            # The exception line may be followed by more output (logs); the first one after the frames wins,
            # unless a later traceback block (chained) follows, which `starts[-1]` already chose.
            break
    return found


class StderrTail:
    """While entered, fd 2 (this process's stderr, inherited by children started meanwhile) is a pipe that a
    thread copies to the real stderr, keeping the last TAIL_LINES lines. On exit fd 2 is the real stderr
    again; the thread keeps copying what the children still write until they close it."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._lock = threading.Lock()
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def __enter__(self) -> StderrTail:
        read_end, write_end = os.pipe()
        self._saved = os.dup(2)
        self._thread = threading.Thread(target=self._copy, args=(read_end, self._saved), daemon=True)
        self._thread.start()
        os.dup2(write_end, 2)
        os.close(write_end)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._saved is not None
        # Our own stderr is direct again; the pipe closes when the last child holding it exits.
        os.dup2(self._saved, 2)

    def wait_for_lines(self, timeout: float) -> None:
        """Wait (bounded) for the copying thread to reach the end of the pipe: the children have exited."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _copy(self, read_end: int, real: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_end, 65536):
                _write_all(real, chunk)
                pending += chunk
                *complete, pending = pending.split(b"\n")
                if complete:
                    with self._lock:
                        self._lines.extend(c.decode(errors="replace") for c in complete)
                pending = pending[-65536:]
        finally:
            if pending:
                with self._lock:
                    self._lines.append(pending.decode(errors="replace"))
            os.close(read_end)
            os.close(real)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            return  # the real stderr is gone: keep reading, or the children would block on a full pipe
        view = view[written:]
