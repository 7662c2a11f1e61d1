"""Canary window metrics from a Prometheus server's HTTP API (the gateway's contract metrics)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import httpx

from servlane_api import metric_names as contract
from servlane_core.rollout.window import MetricsUnavailableError, ModelWindow, WindowMetrics

P95 = 0.95


class PrometheusReader:
    """Reads increase() and histogram_quantile() over the analysis window, per model, for one feature of
    one namespace (the gateway's `namespace` and `feature` labels), from the scrape job `job` only.

    `job` is required: the metric names are public, and any target Prometheus scrapes (a tenant's pod, its
    own PodMonitor) may expose series of those names with made-up numbers; without the job they would be
    summed into the canary's window. `extra_labels` narrows the series further. Counts are increase()'s extrapolated
    floats, so they can be a little above the true count; ratios and quantiles are unaffected because
    every series of one scrape is extrapolated alike. increase() needs two samples inside the window, so
    a window shorter than two scrape intervals is empty: `min_window_seconds` says so to the rollout.
    """

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        job: str,
        extra_labels: Mapping[str, str] | None = None,
        timeout_seconds: float = 5.0,
        scrape_interval_seconds: float = 15.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._server = _origin(base_url)
        self._client = client or httpx.AsyncClient(timeout=timeout_seconds)
        self._owns_client = client is None
        if not job:
            raise ValueError("the gateway's scrape job is required (an empty job would select every target)")
        self._extra_labels = {**(extra_labels or {}), "job": job}
        self._scrape_interval_seconds = scrape_interval_seconds

    @property
    def min_window_seconds(self) -> float:
        return 2 * self._scrape_interval_seconds

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def read(self, namespace: str, feature: str, models: Sequence[str], window_seconds: float) -> WindowMetrics:
        window = f"{max(1, math.ceil(window_seconds))}s"
        # One evaluation time for all queries: increase() extrapolates to the evaluation time, so
        # queries evaluated milliseconds apart would give errors and requests different scales.
        at = f"{time.time():.3f}"
        labels = {**self._extra_labels, "namespace": namespace, "feature": feature}
        selector = _selector(labels)
        # The backend's own 4xx; 499 is the client walking away, nobody's failure.
        client_errors = _selector(labels, f'code=~"4..",code!="{contract.CLIENT_CLOSED_CODE}"')

        def increase(name: str, chosen: str = selector) -> str:
            return f"increase({name}{chosen}[{window}])"

        requests, errors, rejected, ttft, latency = await asyncio.gather(
            self._vector(f"sum by (model) ({increase(contract.REQUESTS)})", at),
            self._vector(f"sum by (model) ({increase(contract.ERRORS)})", at),
            self._vector(f"sum by (model) ({increase(contract.REQUESTS, client_errors)})", at),
            self._vector(f"histogram_quantile({P95}, sum by (model, le) ({increase(contract.TTFT + '_bucket')}))", at),
            self._vector(
                f"histogram_quantile({P95}, sum by (model, le) ({increase(contract.LATENCY + '_bucket')}))", at
            ),
        )
        windows = {
            model: ModelWindow(
                requests=requests.get(model) or 0.0,
                errors=errors.get(model) or 0.0,
                client_errors=rejected.get(model) or 0.0,
                p95_ttft_seconds=ttft.get(model),
                p95_latency_seconds=latency.get(model),
            )
            for model in models
        }
        return WindowMetrics(window_seconds=window_seconds, models=windows)

    async def _vector(self, query: str, at: str) -> dict[str, float | None]:
        """An instant query's result as model -> value (NaN, e.g. a quantile of nothing, becomes None)."""
        try:
            response = await self._client.get(f"{self._base_url}/api/v1/query", params={"query": query, "time": at})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise MetricsUnavailableError(f"Prometheus query failed: {_what_failed(exc)} ({self._server})") from exc
        if body.get("status") != "success":
            raise MetricsUnavailableError(f"Prometheus query failed: {body.get('error', body)}")
        values: dict[str, float | None] = {}
        for series in body["data"]["result"]:
            value = float(series["value"][1])
            values[series["metric"].get("model", "")] = None if math.isnan(value) else value
        return values


# A failed query's message reaches every tenant with a canary (its AIFeature's status, the operator's log, a
# Warning Event): it names the server by scheme, host and port and the failure by its kind, never by httpx's
# text, which quotes the whole URL, with a password in SERVLANE_PROMETHEUS_URL's userinfo.


def _origin(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "an unparseable Prometheus URL"
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "")
    return f"{parts.scheme}://{host}{port}"


def _what_failed(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}".rstrip()
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}"  # ConnectError, RemoteProtocolError, ...: their text may quote the URL
    return "the answer is not JSON"


def _selector(labels: Mapping[str, str], *more: str) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    matchers = [f"{name}={quoted(value)}" for name, value in sorted(labels.items())]
    return "{" + ",".join([*matchers, *more]) + "}"
