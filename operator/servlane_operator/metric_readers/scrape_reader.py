"""Canary window metrics by scraping the gateway pods' /metrics directly (no Prometheus needed).

The window is the time between two reads for the same feature (of one namespace: the series are selected
on the gateway's `namespace` and `feature` labels): the reader keeps each target's previous counters
and histogram buckets in memory and returns the differences. So:
- the first read for a feature (also the first after an operator restart) only takes a baseline and
  returns None, and plan() holds for that interval;
- call read() only when an analysis is due (decide.analysis_due), so the window is the interval;
- a target (gateway pod) seen for the first time contributes from its second scrape on;
- a counter that went down was reset (the pod restarted): its current value is the window's increase.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servlane_api import metric_names as contract
from servlane_core.rollout.quantile import bucket_quantile
from servlane_core.rollout.window import MetricsUnavailableError, ModelWindow, WindowMetrics

log = logging.getLogger(__name__)

P95 = 0.95
# (kind, model, le): kind is requests | errors | client_errors | latency | ttft; le is "" for counters.
SeriesKey = tuple[str, str, str]
FeatureKey = tuple[str, str]  # (namespace, feature)
_KINDS = {
    contract.REQUESTS: "requests",
    contract.ERRORS: "errors",
    contract.LATENCY + "_bucket": "latency",
    contract.TTFT + "_bucket": "ttft",
}
Targets = Sequence[str] | Callable[[], Awaitable[Sequence[str]]]


@dataclass(frozen=True)
class _Snapshot:
    taken_at: float
    by_target: dict[str, dict[SeriesKey, float]]


class ScrapeReader:
    """`targets` are /metrics URLs, or an async callable that lists them (e.g. the gateway pods' IPs).

    `min_window_seconds`: how often the caller reads at most (the operator's analysis timer); a rollout
    interval shorter than that is raised to it, since the window is the time between two reads.
    """

    def __init__(
        self,
        targets: Targets,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_seconds: float = 5.0,
        min_window_seconds: float = 0.0,
    ) -> None:
        self._targets = targets
        self._client = client or httpx.AsyncClient(timeout=timeout_seconds)
        self._owns_client = client is None
        self._clock = clock
        self._min_window_seconds = min_window_seconds
        self._previous: dict[FeatureKey, _Snapshot] = {}

    @property
    def min_window_seconds(self) -> float:
        return self._min_window_seconds

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def forget(self, namespace: str, feature: str) -> None:
        """Drop a deleted feature's baseline."""
        self._previous.pop((namespace, feature), None)

    async def read(
        self, namespace: str, feature: str, models: Sequence[str], window_seconds: float
    ) -> WindowMetrics | None:
        """Increases since the previous read for `feature` (`window_seconds` is only the expected size)."""
        targets = list(self._targets) if isinstance(self._targets, Sequence) else list(await self._targets())
        if not targets:
            raise MetricsUnavailableError("no gateway targets to scrape")
        texts = await asyncio.gather(*(self._scrape(url) for url in targets))
        current = {
            url: _feature_series(text, namespace, feature) for url, text in zip(targets, texts, strict=True) if text
        }
        if not current:
            raise MetricsUnavailableError(f"none of {len(targets)} gateway targets answered")
        now = self._clock()
        previous = self._previous.get((namespace, feature))
        self._previous[(namespace, feature)] = _Snapshot(now, current)
        if previous is None:
            return None
        increases: dict[SeriesKey, float] = defaultdict(float)
        for url, series in current.items():
            before = previous.by_target.get(url)
            if before is None:
                continue  # a new target: this scrape is its baseline
            for key, value in series.items():
                old = before.get(key, 0.0)  # a series born since the last scrape started at 0
                increases[key] += value - old if value >= old else value
        return WindowMetrics(window_seconds=now - previous.taken_at, models=_windows(increases, models))

    async def _scrape(self, url: str) -> str | None:
        try:
            response = await self._client.get(url)
            response.raise_for_status()
            return response.text
        except httpx.HTTPError as exc:
            log.warning("scraping %s failed: %s", url, exc)
            return None


def _feature_series(text: str, namespace: str, feature: str) -> dict[SeriesKey, float]:
    series: dict[SeriesKey, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = _KINDS.get(sample.name)
            labels = sample.labels
            if kind is None or labels.get("feature") != feature or labels.get("namespace") != namespace:
                continue
            le = labels.get("le", "") if kind in ("latency", "ttft") else ""
            # Summed over the other labels (code, reason): the analysis needs per-model totals.
            model = labels.get("model", "")
            series[(kind, model, le)] += float(sample.value)
            code = labels.get("code", "")
            if kind == "requests" and code.startswith("4") and code != contract.CLIENT_CLOSED_CODE:
                series[("client_errors", model, "")] += float(sample.value)  # the backend's own 4xx
    return dict(series)


def _windows(increases: dict[SeriesKey, float], models: Sequence[str]) -> dict[str, ModelWindow]:
    def quantile(kind: str, model: str) -> float | None:
        buckets = [(float(le), v) for (k, m, le), v in increases.items() if k == kind and m == model]
        return bucket_quantile(P95, buckets)

    return {
        model: ModelWindow(
            requests=increases.get(("requests", model, ""), 0.0),
            errors=increases.get(("errors", model, ""), 0.0),
            client_errors=increases.get(("client_errors", model, ""), 0.0),
            p95_ttft_seconds=quantile("ttft", model),
            p95_latency_seconds=quantile("latency", model),
        )
        for model in models
    }
