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
