"""The gateway on several worker processes (`--workers`): one pod's state stays one whatever worker answers.

Which worker takes a connection is the kernel's choice, so the tests choose for it: a worker stopped with
SIGSTOP accepts nothing, and every request sent meanwhile goes to the other. Each worker then has served
known requests, and what they share (the metrics /metrics reports, the limits in Redis) must add up. Plus the
pure parts: the CPU limit read from a cgroup, the automatic count, the settings that refuse an unsafe count.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pydantic import SecretStr, ValidationError

from servlane_api import metric_names as m
from servlane_core.routing.routes import build_route_table
from servlane_gateway.app import create_app
from servlane_gateway.routing.sources import OnTable, parse_objects
from servlane_gateway.settings import GatewaySettings
from servlane_gateway.workers import MAX_AUTO_WORKERS, cpu_limit, settings_json, worker_count
from tests.support.gateway_harness import ServedApp, Upstream, aifeature, aimodel
from tests.support.polling import wait_until
from tests.support.shared_limits import GatewayProcess, RedisServer, prefix, redis_server  # noqa: F401 - fixture
from tests.support.stopped import freeze
from tests.support.worker_processes import worker_pids

# --- pure ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_max", "quota", "period", "expected"),
    [
        ("max 100000\n", None, None, None),
        ("150000 100000\n", None, None, 1.5),
        ("400000 100000", None, None, 4.0),
        (None, "-1\n", "100000\n", None),
        (None, "250000\n", "100000\n", 2.5),
        (None, None, None, None),
        ("garbage", None, None, None),
        ("100000 0", None, None, None),
    ],
)
def test_the_cpu_limit_is_read_from_cgroup_v2_or_v1(
    cpu_max: str | None, quota: str | None, period: str | None, expected: float | None
) -> None:
    assert cpu_limit(cpu_max, quota, period) == expected


def settings(**values: Any) -> GatewaySettings:
    return GatewaySettings(routes_file=Path("routes.json"), **values)


def test_the_automatic_count_follows_the_cpus_given_and_stays_bounded() -> None:
    assert worker_count(settings(), None, 2)[0] == 2
    assert worker_count(settings(), 1.5, 16)[0] == 2  # a fraction of a CPU still gets its process
    assert worker_count(settings(), 0.2, 16)[0] == 1
    assert worker_count(settings(), 4.0, 2)[0] == 2  # never more than the CPUs it may run on
    count, why = worker_count(settings(), None, 64)
    assert count == MAX_AUTO_WORKERS
    assert "at most" in why
    assert worker_count(settings(workers=3), None, 64)[0] == 3  # asked for: as asked


def test_limits_kept_in_memory_mean_one_worker_unless_redis_shares_them() -> None:
    count, why = worker_count(settings(feature_requests_per_minute=10), None, 8)
    assert count == 1
    assert "in memory" in why
    shared = settings(feature_requests_per_minute=10, redis_url="redis://127.0.0.1:6379/0")
    assert worker_count(shared, None, 8)[0] == 8
    with pytest.raises(ValidationError, match="set --redis-url"):
        settings(workers=2, key_max_in_flight=4)
    settings(workers=2)  # no limits: nothing to share


def test_a_sqlite_batch_database_means_one_worker() -> None:
    sqlite = settings(batch_database_url="sqlite:////tmp/batches.db")
    count, why = worker_count(sqlite, None, 8)
    assert count == 1
    assert "SQLite" in why
    with pytest.raises(ValidationError, match="use PostgreSQL"):
        settings(workers=2, batch_database_url="sqlite:////tmp/batches.db")
    postgres = settings(workers=2, batch_database_url="postgresql://u:p@db/batches")
    assert worker_count(postgres, None, 8)[0] == 2


def test_the_workers_rebuild_exactly_the_supervisors_settings() -> None:
    original = settings(workers=2, redis_url="redis://:pw@127.0.0.1:6379/0", feature_tokens_per_minute=100)
    rebuilt = GatewaySettings.model_validate(json.loads(settings_json(original)))
    assert rebuilt == original
    assert isinstance(rebuilt.redis_url, SecretStr)
    assert rebuilt.redis_url.get_secret_value().startswith("redis://:pw@")


def test_two_workers_with_limits_in_memory_refuse_to_start(tmp_path: Path) -> None:
    (tmp_path / "routes.json").write_text("[]")
    argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp_path / "routes.json")]
    argv += ["--workers", "2", "--key-requests-per-minute", "60"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "set --redis-url" in result.stderr


# --- processes -----------------------------------------------------------------------------------------------


@contextmanager
def only(workers: list[int], serving: int) -> Iterator[None]:
    """Every worker but `serving` stopped: new connections all go to it. uvicorn's supervisor pings its
    workers and kills one silent for 5 s, so a block stays short."""
    stopped = [pid for pid in workers if pid != serving]
    for pid in stopped:
        freeze(pid)  # stopped indeed, not about to take one more connection
    try:
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def chat(url: str) -> int:
    """A chat request on a new connection (any worker may take it); its status code."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": "Bearer sk-alpha-00000000000000000000000"},
        timeout=10,
    ).status_code


def scraped(url: str, name: str, **labels: str) -> list[Sample]:
    """The samples of `name` with these labels in /metrics, read on a fresh connection (any worker may answer)."""
    text = httpx.get(url + "/metrics", timeout=10, headers={"connection": "close"}).text
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def requests_counted(url: str) -> float:
    """The 200s /metrics reports."""
    return sum(s.value for s in scraped(url, m.REQUESTS, code="200"))


@pytest.fixture
def two_workers(
    tmp_path: Path,
    upstreams: dict[str, Upstream],
    redis_server: RedisServer,  # noqa: F811 - the imported fixture
    prefix: str,  # noqa: F811
) -> Iterator[tuple[GatewayProcess, list[int]]]:
    gateway = GatewayProcess(
        tmp_path, upstreams, redis_server, prefix, {"workers": 2, "feature_requests_per_minute": 9}
    )
    workers: list[int] = []
    try:
        wait_until("two workers", lambda: len(worker_pids(gateway.process.pid)) == 2, 30)
        workers = worker_pids(gateway.process.pid)
        yield gateway, workers
    finally:
        for pid in workers:  # SIGCONT first: a test that failed inside `only` may have left one stopped
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)  # else orphaned by the supervisor's SIGKILL below
        gateway.kill()


def test_any_worker_reports_the_whole_pods_metrics_and_they_share_one_budget(
    two_workers: tuple[GatewayProcess, list[int]],
) -> None:
    gateway, (first, second) = two_workers
    # The feature's budget is 9 requests a minute, in Redis: 5 through one worker, then 5 through the other.
    codes = []
    for worker in (first, second):
        with only([first, second], serving=worker):
            for _ in range(5):
                codes.append(chat(gateway.url))
            # While the other worker is stopped, this one still counts its requests.
            assert requests_counted(gateway.metrics_base) == codes.count(200)
    assert codes == [200] * 9 + [429], codes
    # Each worker answered some of the 9: every scrape, whoever answers it, counts all of them.
    for worker in (first, second):
        with only([first, second], serving=worker):
            assert requests_counted(gateway.metrics_base) == 9


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_workers_die_with_a_supervisor_that_is_killed(two_workers: tuple[GatewayProcess, list[int]]) -> None:
    """As they would with the container: orphans would serve on, and renew their places in Redis."""
    gateway, workers = two_workers
    assert all(alive(pid) for pid in workers)
    gateway.kill()  # SIGKILL: uvicorn's supervisor gets no chance to stop them
    wait_until("the workers gone", lambda: not any(alive(pid) for pid in workers), 10)


class LateSource:
    """A route source whose first table comes a while after start, as a cluster watch's first list does."""

    def __init__(self, objects: list[dict[str, Any]], delay: float) -> None:
        self.table = build_route_table(*parse_objects(objects))
        self.delay = delay
        self.task: asyncio.Task[None] | None = None

    async def start(self, on_table: OnTable) -> None:
        async def deliver() -> None:
            await asyncio.sleep(self.delay)
            on_table(self.table)

        self.task = asyncio.create_task(deliver())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


def test_a_worker_takes_connections_only_once_it_has_its_routes(upstreams: dict[str, Upstream], tmp_path: Path) -> None:
    """Else a worker (re)started beside serving ones answers 404 for every model while the pod stays Ready."""
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    config = GatewaySettings(routes_file=tmp_path / "unused.json")  # the source below replaces it
    app = create_app(config, source=LateSource(objects, delay=0.5))
    with ServedApp(app) as served:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(served.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200


def weights(url: str) -> dict[str, float]:
    return {s.labels["model"]: s.value for s in scraped(url, m.WEIGHT, feature="chat")}


def test_a_model_no_longer_routed_to_leaves_the_weights_whichever_worker_answers(
    two_workers: tuple[GatewayProcess, list[int]], upstreams: dict[str, Upstream], tmp_path: Path
) -> None:
    """The multiprocess files keep every series ever written; a rolled-back canary must not linger at 0."""
    gateway, _ = two_workers
    assert weights(gateway.metrics_base) == {"chat-v1": 100.0}
    moved = [aimodel("chat-v2", upstreams["v2"].url), aifeature("chat", [("chat-v2", 100)])]
    (tmp_path / "replica-routes.json").write_text(json.dumps(moved))
    # Several scrapes in a row, each on a new connection: both workers must have moved on.

    def moved_on() -> bool:
        return all(weights(gateway.metrics_base) == {"chat-v2": 100.0} for _ in range(6))

    wait_until("only chat-v2 weighted", moved_on, 20)
