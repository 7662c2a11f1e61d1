"""A gateway worker's metrics in memory, written to prometheus_client's multiprocess files in batches
(servlane_gateway.worker_metrics): what a scrape sums must be what prometheus_client's own per-write files give,
a scrape must count a sibling's values at once (it asks the sibling to write them), a sibling that never answers
must neither hang the scrape nor be behind for longer than the flush interval, and a dead worker's in-flight
gauges must go.

Each side runs in a process of its own: the value class is chosen per process, and the files are named by pid."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from servlane_gateway import worker_metrics
from tests.support.polling import wait_until
from tests.support.stopped import freeze

# One of every kind the gateway uses: counters, histograms, gauges summed over live workers, the most recent,
# the max. Then the operations `ops` lists, on the children `ops` names, by the gateway's own writers.
WRITER = """
import json, os, sys
from prometheus_client import Counter, Gauge, Histogram
from servlane_gateway.gateway_metrics import Increment, Observe
from servlane_gateway import worker_metrics

mode, ops = sys.argv[1], json.loads(sys.argv[2])
if mode == "batched":
    worker_metrics.FILES.start(os.environ["PROMETHEUS_MULTIPROC_DIR"])
counter = Counter("requests", "r", ["model"])
histogram = Histogram("seconds", "s", ["model"], buckets=(0.1, 1.0, 10.0))
live = Gauge("in_flight", "i", ["model"], multiprocess_mode="livesum")
recent = Gauge("weight", "w", ["model"], multiprocess_mode="mostrecent")
top = Gauge("store", "t", [], multiprocess_mode="max")
for op, model, amount in ops:
    if op == "inc":
        Increment(counter.labels(model)).inc(amount)
    elif op == "observe":
        Observe(histogram.labels(model)).observe(amount)
    elif op == "live":
        live.labels(model).inc(amount)
    elif op == "set":
        recent.labels(model).set(amount)
    else:
        top.set(amount)
if mode == "batched":
    worker_metrics.FILES.flush()
if len(sys.argv) > 3:  # stay alive until told (the freshness test)
    print("ready", flush=True)
    sys.stdin.readline()
"""


def random_ops(seed: int, count: int = 300) -> list[tuple[str, str, float]]:
    rng = random.Random(seed)
    ops = []
    for _ in range(count):
        op = rng.choice(["inc", "observe", "live", "set", "max"])
        amount = {"inc": rng.choice([1, 1, 1, 2.5]), "observe": rng.choice([0.05, 0.1, 0.5, 3, 20]),
                  "live": rng.choice([1, -1]), "set": rng.randint(0, 100), "max": rng.random()}[op]  # fmt: skip
        ops.append((op, rng.choice(["a", "b", "c"]), float(amount)))
    return ops


def scrape(directory: Path) -> bytes:
    """The exposition of the files' sums, its lines sorted (the families come in the order the files list)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(directory))  # type: ignore[no-untyped-call]
    return b"\n".join(sorted(generate_latest(registry).splitlines()))


def write(mode: str, directory: Path, ops: list[tuple[str, str, float]]) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run([sys.executable, "-c", WRITER, mode, json.dumps(ops)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


def test_the_sums_are_those_of_prometheus_clients_own_files(tmp_path: Path) -> None:
    for seed in range(3):
        ops = random_ops(seed)
        results = {}
        for mode in ("library", "batched"):
            directory = tmp_path / f"{mode}-{seed}"
            directory.mkdir()
            for half in (ops[: len(ops) // 2], ops[len(ops) // 2 :]):  # two workers, one after the other
                write(mode, directory, half)
            results[mode] = scrape(directory)
        assert b"requests_total" in results["library"]
        assert b"seconds_bucket" in results["library"]
        assert results["batched"] == results["library"], seed


def start_sibling(
    directory: Path, ops: list[tuple[str, str, float]], flush_seconds: float = worker_metrics.FLUSH_SECONDS
) -> subprocess.Popen[bytes]:
    """A batched worker that made `ops` and wrote none of them itself (its periodic write every `flush_seconds`
    aside): it stays alive until killed."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    script = WRITER.replace('if mode == "batched":\n    worker_metrics.FILES.flush()\n', "")
    script = script.replace(
        "    worker_metrics.FILES.start(",
        f"    worker_metrics.FLUSH_SECONDS = {flush_seconds!r}\n    worker_metrics.FILES.start(",
    )
    assert script.count("FLUSH_SECONDS = ") == 1
    sibling = subprocess.Popen(
        [sys.executable, "-c", script, "batched", json.dumps(ops), "wait"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert sibling.stdout is not None
    assert sibling.stdout.readline().strip() == b"ready"
    return sibling


def test_a_scrape_counts_a_siblings_values_at_once(tmp_path: Path) -> None:
    # The sibling's periodic write an hour away: only the ask can bring its counts into the files.
    sibling = start_sibling(tmp_path, [("inc", "a", 1.0)] * 7, flush_seconds=3600.0)
    try:
        assert b"requests_total" not in scrape(tmp_path)
        started = time.monotonic()
        late = worker_metrics.ask_siblings(tmp_path)
        asked_within = time.monotonic() - started
        assert late == []
        assert b'requests_total{model="a"} 7.0' in scrape(tmp_path)
        assert asked_within < worker_metrics.SIBLING_WAIT_SECONDS
    finally:
        sibling.kill()
        sibling.wait(timeout=10)


def test_a_sibling_that_does_not_answer_neither_hangs_the_scrape_nor_stays_behind(tmp_path: Path) -> None:
    sibling = start_sibling(tmp_path, [("inc", "a", 1.0)] * 3)
    try:
        freeze(sibling.pid)  # alive, files and all, but answering nothing
        started = time.monotonic()
        assert worker_metrics.ask_siblings(tmp_path) == [sibling.pid]
        assert time.monotonic() - started < worker_metrics.SIBLING_WAIT_SECONDS * 4
        os.kill(sibling.pid, signal.SIGCONT)
        wait_until(
            "the sibling's 3 requests in the files by its own periodic write",
            lambda: b'requests_total{model="a"} 3.0' in scrape(tmp_path),
            timeout=worker_metrics.FLUSH_SECONDS * 5,
            interval=0.05,
        )
    finally:
        sibling.kill()
        sibling.wait(timeout=10)


SQUATTED = """
import os, socket, sys
from prometheus_client import Counter
from servlane_gateway import worker_metrics

directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
squatter.bind(worker_metrics.flush_address(directory, os.getpid()))  # this worker's flush socket name, taken
worker_metrics.FLUSH_SECONDS = 0.05
worker_metrics.FILES.start(directory)
Counter("requests", "r", ["model"]).labels("a").inc(4)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_worker_whose_flush_socket_name_is_taken_still_serves_and_writes_its_counts(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    worker = subprocess.Popen(
        [sys.executable, "-c", SQUATTED], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == b"ready"  # started, not crashed on the taken name
        assert worker_metrics.ask_siblings(tmp_path) == []  # not listed as one to ask: nobody waits for it
        wait_until(
            "its count in the files by its periodic write",
            lambda: b'requests_total{model="a"} 4.0' in scrape(tmp_path),
            timeout=10,
            interval=0.05,
        )
    finally:
        worker.kill()
        _, stderr = worker.communicate(timeout=10)
    assert b"no flush socket" in stderr


def test_a_dead_workers_in_flight_requests_leave_the_sums_and_its_counts_stay(tmp_path: Path) -> None:
    ops = [("inc", "a", 1.0), ("live", "a", 1.0), ("live", "a", 1.0)]  # killed with two requests in flight
    write("batched", tmp_path, ops)
    before = scrape(tmp_path)
    assert b'in_flight{model="a"} 2.0' in before
    removed = worker_metrics.forget_dead_workers(tmp_path)
    assert len(removed) == 1
    after = scrape(tmp_path)
    assert b"in_flight" not in after
    assert b'requests_total{model="a"} 1.0' in after  # a counter keeps what the dead worker counted


def test_a_running_workers_files_are_kept(tmp_path: Path) -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    try:
        mine = tmp_path / f"gauge_livesum_{os.getpid()}.db"
        theirs = tmp_path / f"gauge_livesum_{alive.pid}.db"
        for path in (mine, theirs):
            path.write_bytes(b"")
        assert worker_metrics.forget_dead_workers(tmp_path) == []
        assert mine.exists()
        assert theirs.exists()
    finally:
        alive.kill()
        alive.wait(timeout=10)


def test_a_workers_file_is_read_by_a_scrape_only_once_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A scrape that read a sibling's file while it was being made found it empty and failed (struct.error).
    visible_while_made: list[list[str]] = []
    made: Any = worker_metrics.MmapedDict  # type: ignore[attr-defined]

    def making(path: str) -> Any:
        mapped = made(path)  # the file exists from here on, but is not yet where a collector reads
        visible_while_made.append(sorted(p.name for p in tmp_path.glob("*.db")))
        return mapped

    monkeypatch.setattr(worker_metrics, "MmapedDict", making)
    files = worker_metrics.BatchedFiles()
    files._directory = str(tmp_path)
    files._file("counter")
    assert visible_while_made == [[]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{os.getpid()}.db"]
    assert scrape(tmp_path) == b""  # read whole: a header, no series yet
