"""Metrics of a gateway worker process, kept in its memory and written to prometheus_client's multiprocess files
in batches, and every sibling's written on demand before a scrape sums them.

prometheus_client's multiprocess mode (servlane_gateway.workers) gives every value an mmap-backed twin and writes
it on each inc/observe: a lock and a struct pack into the file per write, a dozen per request. Here each value is
the single-process kind (MutexValue, a lock and an add), and `flush()` copies the ones that changed into the very
files, keys and modes prometheus_client would have written (so its MultiProcessCollector sums them unchanged).

A scrape must count every request answered before it, whichever worker answered it. So the worker answering a
scrape calls `flush_pod()`: it writes its own values, then asks each running sibling to write its own (a datagram
on the sibling's flush socket, an abstract Unix socket named by the directory and the pid) and waits for each to
say it did, at most SIBLING_WAIT_SECONDS. A sibling answers from a thread of its own, not its event loop, so a busy
loop does not hold the scrape back; every value updated before the ask is in memory by then (updates happen on
the loop before the response is written). A sibling that does not answer in time (stopped, or its thread starved)
is at most FLUSH_SECONDS behind: the same thread also writes every FLUSH_SECONDS, and at exit. The sockets live in
the pod's network namespace, so only the pod's own processes can ask; an ask costs one flush.

A worker that died leaves its files: its counters rightly stay in the sums (prometheus_client's behaviour), its
"live" gauges (in-flight requests) must not, so the answering worker drops the live files of dead processes
(prometheus_client's mark_process_dead, which nothing calls on its own).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import mark_process_dead

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # the most a sibling that does not answer an ask is behind
SIBLING_WAIT_SECONDS = 0.5  # how long a scrape waits for its siblings' flushes, all together
_LIVE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")
_WORKER_MARK = "batched-worker-"  # + pid: a file per batched worker (the collector reads *.db files only)


class BatchedValue(values.MutexValue):
    """A value in this process's memory (MutexValue: what one process uses), remembered by `BatchedFiles` so
    that flush() writes it where prometheus_client's multiprocess value would have written it at once."""

    _timestamp = 0.0  # what a mostrecent gauge's set() stamps; 0 for the rest, as prometheus_client writes it

    def __init__(
        self,
        typ: str,
        metric_name: str,
        name: str,
        labelnames: Any,
        labelvalues: Any,
        help_text: str,
        multiprocess_mode: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(typ, metric_name, name, labelnames, labelvalues, help_text, **kwargs)  # type: ignore[no-untyped-call]
        self.file_prefix = f"{typ}_{multiprocess_mode}" if typ == "gauge" else typ
        self.key: str = mmap_key(metric_name, name, labelnames, labelvalues, help_text)
        self.written: tuple[float, float] | None = None  # what the file holds of this process's value
        FILES.remember(self)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with self._lock:
            self._value = value
            self._timestamp = timestamp or 0.0


def flush_address(directory: str | Path, pid: int) -> str:
    """The abstract Unix socket a worker of this metrics directory answers flush asks on (no file to clean up;
    the directory's digest keeps two gateways on one host apart)."""
    digest = hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:16]
    return f"\0servlane-metrics-{digest}-{pid}"


class BatchedFiles:
    """This process's files in the multiprocess directory, the values flush() writes into them, and the thread
    that writes them periodically and when a sibling asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the flush thread and a scrape's render thread both flush
        self._values: list[BatchedValue] = []
        self._files: dict[str, MmapedDict] = {}
        self._directory: str | None = None

    def remember(self, value: BatchedValue) -> None:
        with self._lock:
            self._values.append(value)

    def _file(self, prefix: str) -> MmapedDict:
        found = self._files.get(prefix)
        if found is None:
            assert self._directory is not None
            # Made under a name the collector does not read (it reads *.db), then renamed: a sibling's scrape
            # summing the files while this one is made would otherwise read it empty, before its header is
            # written, and fail (prometheus_client's struct.error). The mapping follows the file, not its name.
            final = os.path.join(self._directory, f"{prefix}_{os.getpid()}.db")
            found = MmapedDict(final + ".new")  # type: ignore[no-untyped-call]
            os.replace(final + ".new", final)
            self._files[prefix] = found
        return found

    def flush(self) -> int:
        """Writes every value that changed since the last flush; returns how many."""
        if self._directory is None:
            return 0
        changed = 0
        with self._lock:
            for value in self._values:
                now = (value._value, value._timestamp)  # a float read is atomic: no need for its lock
                if now == value.written:
                    continue
                # (prometheus_client's value would start from what a file of this pid held: none can, the
                # directory is emptied when the supervisor starts and a pid does not come back in its life.)
                self._file(value.file_prefix).write_value(value.key, now[0], now[1])  # type: ignore[no-untyped-call]
                value.written = now
                changed += 1
        return changed

    def start(self, directory: str) -> None:
        """From now on new values are batched; a thread flushes every FLUSH_SECONDS, whenever a sibling asks,
        and once more at exit. Before the process made any value: values made before stay the library's."""
        self._directory = directory
        values.ValueClass = BatchedValue  # read by every metric when it makes a child
        atexit.register(self.flush)
        asks: socket.socket | None = None
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            bound.bind(flush_address(directory, os.getpid()))
            asks = bound
        except OSError as exc:  # the name taken (by whom? nothing of ours): write periodically, answer no ask
            bound.close()
            log.warning("metrics: no flush socket (%s): a scrape may see this worker's counts up to %.0fs late",
                        exc, FLUSH_SECONDS)  # fmt: skip
        else:
            (Path(directory) / f"{_WORKER_MARK}{os.getpid()}").touch()  # siblings find it so, files or none yet
        threading.Thread(target=self._answer_asks, args=(asks,), name="metrics-flush", daemon=True).start()

    def _answer_asks(self, asks: socket.socket | None) -> None:
        if asks is not None:
            asks.settimeout(FLUSH_SECONDS)
        while True:
            ask: bytes | None = None
            sender: Any = None
            if asks is None:
                time.sleep(FLUSH_SECONDS)
            else:
                with contextlib.suppress(TimeoutError):  # no ask within FLUSH_SECONDS: the periodic write
                    ask, sender = asks.recvfrom(64)
            try:
                self.flush()
            except Exception:  # a full disk must not end the flushes for good, nor the worker
                log.exception("writing this worker's metrics failed")
                continue  # no answer: the asker must not count on files that were not written
            if asks is not None and ask is not None and sender:
                with contextlib.suppress(OSError):  # the asker gave up waiting and closed its socket
                    asks.sendto(ask, sender)  # the ask itself back (its nonce, this pid): "written"

    def flush_pod(self) -> list[int]:
        """Before a scrape sums the files: this worker's values written, and every running sibling's (asked, and
        waited for up to SIBLING_WAIT_SECONDS). Returns the pids of the siblings that did not answer in time."""
        self.flush()
        return [] if self._directory is None else ask_siblings(self._directory)


def ask_siblings(directory: str | Path) -> list[int]:
    """Asks every other running worker of `directory` to write its values, and waits until each said it did, at
    most SIBLING_WAIT_SECONDS in all; returns the pids of those that did not answer in time."""
    siblings = {pid for pid in _workers(directory) if pid != os.getpid() and _running(pid)}
    if not siblings:
        return []
    nonce = os.urandom(8)
    waiting: set[int] = set()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ask:
        ask.bind("")  # an abstract address of its own, chosen by the kernel: where the answers come
        for pid in siblings:
            try:
                ask.sendto(nonce + str(pid).encode(), flush_address(directory, pid))
                waiting.add(pid)
            except OSError:  # its socket is gone with it (it exited after the listing)
                pass
        deadline = time.monotonic() + SIBLING_WAIT_SECONDS
        while waiting and (left := deadline - time.monotonic()) > 0:
            ask.settimeout(left)
            try:
                answer = ask.recv(64)
            except TimeoutError:
                break
            if answer.startswith(nonce):
                waiting.discard(int(answer[len(nonce) :]))
    if waiting:
        log.warning(
            "metrics of worker(s) %s did not answer a scrape's flush in %.1fs: their counts in it are up to %.0fs old",
            sorted(waiting), SIBLING_WAIT_SECONDS, FLUSH_SECONDS,
        )  # fmt: skip
    return sorted(waiting)


FILES = BatchedFiles()


def _workers(directory: str | Path) -> set[int]:
    """The pids of the batched workers started in `directory` (dead ones included: the caller checks)."""
    return {int(path.name[len(_WORKER_MARK) :]) for path in Path(directory).glob(f"{_WORKER_MARK}*")}


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
