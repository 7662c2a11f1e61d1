"""The canary metric readers against a real gateway-contract endpoint: via a real Prometheus, and scraped directly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx
import pytest

from servlane_api import metric_names as contract
from servlane_core.rollout import MetricsUnavailableError
from servlane_operator.context import canary_reader
from servlane_operator.metric_readers.prometheus_reader import PrometheusReader
from servlane_operator.metric_readers.scrape_reader import ScrapeReader
from servlane_operator.settings import OperatorSettings
from tests.prometheus.conftest import GATEWAY_JOB, IMPOSTOR_JOB
from tests.support.gateway_endpoint import GatewayMetrics

DEADLINE_SECONDS = 60.0
NAMESPACE = "prod"
SERVED, CANARY_ERRORS, CANARY_REJECTED, CANARY_GONE = 200, 14, 10, 6
CANARY_REQUESTS = SERVED + CANARY_REJECTED + CANARY_GONE
STABLE_REQUESTS, STABLE_ERRORS = 100, 1
# Only successes are in the histograms: 186 of the 200, the 20 slow ones last. p95 by linear interpolation
# inside the bucket holding rank 0.95 * 186: 166 fast requests sit in lower buckets, the 20 slow ones in
# (2.5, 5] for latency and (0.5, 1] for time to first token.
SUCCESSES, FAST = SERVED - CANARY_ERRORS, SERVED - CANARY_ERRORS - 20
EXPECTED_P95_LATENCY = 2.5 + (5 - 2.5) * (0.95 * SUCCESSES - FAST) / 20
EXPECTED_P95_TTFT = 0.5 + (1 - 0.5) * (0.95 * SUCCESSES - FAST) / 20


def _drive_chat_traffic(gateway: GatewayMetrics) -> None:
    for i in range(SERVED):
        slow = i >= 180
        gateway.serve("chat", "b", latency=3.0 if slow else 0.3, ttft=0.7 if slow else 0.04, error=i < CANARY_ERRORS)
    for _ in range(CANARY_REJECTED):
        gateway.answer("chat", "b", "429")  # the backend shedding load: a 4xx of its own
    for _ in range(CANARY_GONE):
        gateway.answer("chat", "b", "499")  # clients that walked away: nobody's failure
    for i in range(STABLE_REQUESTS):
        gateway.serve("chat", "a", latency=0.1, ttft=0.02, error=i < STABLE_ERRORS)
    # The same feature and model names in another namespace: never part of prod's windows.
    for _ in range(50):
        gateway.serve("chat", "b", latency=9.0, ttft=9.0, error=True, namespace="staging")
        gateway.answer("chat", "b", "400", namespace="staging")


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)  # poll interval under a deadline
    raise TimeoutError(f"timed out waiting for {what}")


async def _query(client: httpx.AsyncClient, base_url: str, promql: str) -> list[float]:
    response = await client.get(f"{base_url}/api/v1/query", params={"query": promql})
    response.raise_for_status()
    return [float(series["value"][1]) for series in response.json()["data"]["result"]]


async def test_prometheus_reader_reads_error_rate_and_p95(gateway_metrics: GatewayMetrics, prometheus: str) -> None:
    for model in ("a", "b"):
        gateway_metrics.declare("chat", model)
    selector = f'{contract.REQUESTS}{{job="{GATEWAY_JOB}",namespace="{NAMESPACE}",feature="chat"}}'
    async with httpx.AsyncClient(timeout=5) as client:

        async def zero_samples_scraped() -> bool:
            # Every request series scraped at 0, so increase() starts from a known 0.
            counts = await _query(client, prometheus, f"count_over_time({selector}[1m])")
            return len(counts) == 8 and min(counts) >= 1

        await _until(zero_samples_scraped, "Prometheus to scrape the declared series")
        scraper = ScrapeReader([gateway_metrics.url], client=client)
        assert await scraper.read(NAMESPACE, "chat", ["b", "a"], 60) is None  # its baseline, for the cross-check
        _drive_chat_traffic(gateway_metrics)

        async def traffic_scraped() -> bool:
            return await _query(client, prometheus, f"sum({selector})") == [CANARY_REQUESTS + STABLE_REQUESTS]

        await _until(traffic_scraped, "Prometheus to scrape the traffic")
        reader = PrometheusReader(prometheus, client=client, job=GATEWAY_JOB, scrape_interval_seconds=1)
        assert reader.min_window_seconds == 2
        metrics = await reader.read(NAMESPACE, "chat", ["b", "a", "absent"], window_seconds=60)
        scraped = await scraper.read(NAMESPACE, "chat", ["b", "a"], 60)

    canary, stable = metrics.models["b"], metrics.models["a"]
    # increase() extrapolates every series of one scrape alike: counts may exceed the truth, ratios and
    # quantiles do not move. From a 0 sample it extrapolates only forward, by at most 1.1 average sample
    # intervals: with as few as two samples in the window, up to 2.1 times the count.
    assert CANARY_REQUESTS <= canary.requests <= CANARY_REQUESTS * 2.1 + 1e-6
    assert canary.error_rate == pytest.approx(CANARY_ERRORS / CANARY_REQUESTS)
    assert canary.client_error_rate == pytest.approx(CANARY_REJECTED / CANARY_REQUESTS)
    assert canary.p95_latency_seconds == pytest.approx(EXPECTED_P95_LATENCY)
    assert canary.p95_ttft_seconds == pytest.approx(EXPECTED_P95_TTFT)
    assert stable.error_rate == pytest.approx(STABLE_ERRORS / STABLE_REQUESTS)
    assert metrics.models["absent"].requests == 0
    assert metrics.models["absent"].p95_latency_seconds is None
    # The direct scrape of the same endpoint agrees with Prometheus.
    assert scraped is not None
    assert scraped.models["b"].error_rate == pytest.approx(canary.error_rate)
    assert scraped.models["b"].client_errors == CANARY_REJECTED
    assert scraped.models["b"].p95_latency_seconds == pytest.approx(canary.p95_latency_seconds)
    assert scraped.models["b"].p95_ttft_seconds == pytest.approx(canary.p95_ttft_seconds)


async def test_series_of_another_scrape_job_never_enter_the_canary_window(
    gateway_metrics: GatewayMetrics, impostor_metrics: GatewayMetrics, prometheus: str
) -> None:
    """A tenant's pod that Prometheus scrapes may expose the gateway's metric names with another team's
    namespace, feature and model labels, and made-up numbers: the canary reads the gateway's job only."""
    for metrics in (gateway_metrics, impostor_metrics):
        metrics.declare("chat", "b")

    def requests(job: str) -> str:
        return f'sum({contract.REQUESTS}{{job="{job}",namespace="{NAMESPACE}",feature="chat",model="b"}})'

    async with httpx.AsyncClient(timeout=5) as client:

        async def declared_scraped() -> bool:
            return all(
                [await _query(client, prometheus, requests(job)) == [0.0] for job in (GATEWAY_JOB, IMPOSTOR_JOB)]
            )

        await _until(declared_scraped, "Prometheus to scrape both targets' declared series")
        for i in range(20):  # the canary fails half its requests ...
            gateway_metrics.serve("chat", "b", latency=0.3, ttft=0.04, error=i % 2 == 0)
        for _ in range(2000):  # ... and the impostor reports a flawless one
            impostor_metrics.serve("chat", "b", latency=0.01, ttft=0.01)

        async def traffic_scraped() -> bool:
            return await _query(client, prometheus, requests(GATEWAY_JOB)) == [20.0] and await _query(
                client, prometheus, requests(IMPOSTOR_JOB)
            ) == [2000.0]

        await _until(traffic_scraped, "Prometheus to scrape both targets' traffic")
        # The reader as the operator builds it from its settings.
        settings = OperatorSettings(
            prometheus_url=prometheus, prometheus_gateway_job=GATEWAY_JOB, prometheus_scrape_interval_seconds=1
        )
        reader = canary_reader(settings, cast(Any, None))  # no Kubernetes needed with Prometheus
        assert isinstance(reader, PrometheusReader)
        try:
            canary = (await reader.read(NAMESPACE, "chat", ["b"], window_seconds=60)).models["b"]
        finally:
            await reader.aclose()

    # increase() extrapolates the 20 (33.28 seen on a loaded machine; at most 2.1 times, see above), but
    # never adds the impostor's 2000.
    assert 20 <= canary.requests <= 20 * 2.1 + 1e-6
    assert canary.error_rate == pytest.approx(0.5)
    assert canary.p95_latency_seconds is not None
    assert canary.p95_latency_seconds > 0.1


def test_a_reader_without_the_gateways_job_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="scrape job is required"):
        PrometheusReader("http://127.0.0.1:9", job="")


async def test_scrape_reader_windows_across_gateway_pods(
    gateway_metrics: GatewayMetrics, second_gateway_metrics: GatewayMetrics
) -> None:
    targets = [gateway_metrics.url]

    async def list_targets() -> list[str]:
        return list(targets)

    async with httpx.AsyncClient(timeout=5) as client:
        reader = ScrapeReader(list_targets, client=client)
        _drive_chat_traffic(gateway_metrics)  # before the baseline: not in any window
        assert await reader.read(NAMESPACE, "chat", ["b"], 60) is None

        _drive_chat_traffic(gateway_metrics)
        first = await reader.read(NAMESPACE, "chat", ["b", "a"], 60)
        assert first is not None
        assert first.window_seconds > 0
        canary = first.models["b"]
        assert (canary.requests, canary.errors, canary.client_errors) == (
            CANARY_REQUESTS,
            CANARY_ERRORS,
            CANARY_REJECTED,
        )
        assert canary.p95_latency_seconds == pytest.approx(EXPECTED_P95_LATENCY)
        assert canary.p95_ttft_seconds == pytest.approx(EXPECTED_P95_TTFT)
        assert first.models["a"].error_rate == pytest.approx(STABLE_ERRORS / STABLE_REQUESTS)

        idle = await reader.read(NAMESPACE, "chat", ["b"], 60)
        assert idle is not None
        assert (idle.models["b"].requests, idle.models["b"].error_rate, idle.models["b"].p95_latency_seconds) == (
            0,
            None,
            None,
        )

        # A second gateway pod appears: its first scrape is its baseline, then both pods add up.
        _drive_chat_traffic(second_gateway_metrics)
        targets.append(second_gateway_metrics.url)
        joined = await reader.read(NAMESPACE, "chat", ["b"], 60)
        assert joined is not None
        assert joined.models["b"].requests == 0
        _drive_chat_traffic(gateway_metrics)
        _drive_chat_traffic(second_gateway_metrics)
        both = await reader.read(NAMESPACE, "chat", ["b"], 60)
        assert both is not None
        assert both.models["b"].requests == 2 * CANARY_REQUESTS
        assert both.models["b"].p95_latency_seconds == pytest.approx(EXPECTED_P95_LATENCY)

        # Another feature, or the same feature in another namespace, keeps its own baseline.
        assert await reader.read(NAMESPACE, "search", ["b"], 60) is None
        assert await reader.read("staging", "chat", ["b"], 60) is None


async def test_scrape_reader_skips_a_dead_pod_and_fails_when_all_are(gateway_metrics: GatewayMetrics) -> None:
    dead = "http://127.0.0.1:9/metrics"  # nothing listens on the discard port here
    async with httpx.AsyncClient(timeout=2) as client:
        reader = ScrapeReader([gateway_metrics.url, dead], client=client)
        assert await reader.read(NAMESPACE, "chat", ["b"], 60) is None
        _drive_chat_traffic(gateway_metrics)
        metrics = await reader.read(NAMESPACE, "chat", ["b"], 60)
        assert metrics is not None
        assert metrics.models["b"].requests == CANARY_REQUESTS
        with pytest.raises(MetricsUnavailableError, match="none of 1"):
            await ScrapeReader([dead], client=client).read(NAMESPACE, "chat", ["b"], 60)
