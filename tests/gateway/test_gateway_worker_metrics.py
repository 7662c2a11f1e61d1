"""Gateway workers' metrics files (servlane_gateway.worker_metrics): a dead worker's in-flight gauges leave the
sums, its counts stay, a running worker's files are kept. Each writer is a process of its own (files are named by
pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from servlane_gateway import worker_metrics

# One of every kind the gateway uses: counters, histograms, gauges summed over live workers, the most recent,
# the max. Then the operations `ops` lists, on the children `ops` names, by the gateway's own writers.
WRITER = """
import json, os, sys
from prometheus_client import Counter, Gauge, Histogram
from servlane_gateway.gateway_metrics import Increment, Observe

ops = json.loads(sys.argv[1])
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
"""


def scrape(directory: Path) -> bytes:
    """The exposition of the files' sums, its lines sorted (the families come in the order the files list)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(directory))  # type: ignore[no-untyped-call]
    return b"\n".join(sorted(generate_latest(registry).splitlines()))


def write(directory: Path, ops: list[tuple[str, str, float]]) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run([sys.executable, "-c", WRITER, json.dumps(ops)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


def test_a_dead_workers_in_flight_requests_leave_the_sums_and_its_counts_stay(tmp_path: Path) -> None:
    ops = [("inc", "a", 1.0), ("live", "a", 1.0), ("live", "a", 1.0)]  # killed with two requests in flight
    write(tmp_path, ops)
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


SWAPPED_WRITER = (
    """
import os, sys
from servlane_gateway import worker_metrics
assert worker_metrics.values_without_fork_check(os.environ["PROMETHEUS_MULTIPROC_DIR"])
"""
    + WRITER
)


def test_values_without_the_fork_check_write_the_same_files(tmp_path: Path) -> None:
    ops = [("inc", "a", 1.0), ("inc", "b", 2.0), ("observe", "a", 0.5), ("observe", "a", 20.0)]
    ops += [("live", "a", 1.0), ("set", "a", 3.0), ("max", "", 7.0)]
    plain, swapped = tmp_path / "plain", tmp_path / "swapped"
    plain.mkdir()
    swapped.mkdir()
    write(plain, ops)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(swapped)}
    done = subprocess.run([sys.executable, "-c", SWAPPED_WRITER, json.dumps(ops)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert scrape(swapped) == scrape(plain)
    assert b'requests_total{model="b"} 2.0' in scrape(swapped)


UPDATES_WITHOUT_GETPID = """
import os, sys
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from servlane_gateway import worker_metrics

directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
assert worker_metrics.values_without_fork_check(directory)
counter = Counter("requests", "r", ["model"])
child = counter.labels("a")
calls = []
def count_getpid(frame, event, arg):  # prometheus_client holds os.getpid itself: counted as it is called
    if event == "c_call" and arg is os.getpid:
        calls.append(1)
for n in range(1, 51):
    sys.setprofile(count_getpid)
    child.inc()
    sys.setprofile(None)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, directory)
    # each update is in the file at once: a scrape by another worker counts it
    assert f'requests_total{{model="a"}} {float(n)}' in generate_latest(registry).decode(), n
print(len(calls))
# a second call finds this process's files and changes nothing
assert not worker_metrics.values_without_fork_check(directory)
"""


def test_updates_are_in_the_files_at_once_without_a_pid_lookup_each(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", UPDATES_WITHOUT_GETPID], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["0"]
