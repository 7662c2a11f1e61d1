"""Canary window metrics by scraping the gateway pods' /metrics directly (no Prometheus needed).

The window is the time between two reads for the same feature: the reader keeps each target's
previous counters and histogram buckets in memory and returns the differences. So:
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

from modelplane_api import metrics as contract
from modelplane_operator.rollout.metrics import MetricsUnavailableError, ModelWindow, WindowMetrics
from modelplane_operator.rollout.quantile import bucket_quantile

log = logging.getLogger(__name__)

P95 = 0.95
# (kind, model, le): kind is requests | errors | latency | ttft; le is "" for counters.
SeriesKey = tuple[str, str, str]
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
    """`targets` are /metrics URLs, or an async callable that lists them (e.g. the gateway pods' IPs)."""

    def __init__(
        self,
        targets: Targets,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_seconds: float = 5.0,
    ) -> None:
        self._targets = targets
        self._client = client or httpx.AsyncClient(timeout=timeout_seconds)
        self._owns_client = client is None
        self._clock = clock
        self._previous: dict[str, _Snapshot] = {}

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def forget(self, feature: str) -> None:
        """Drop a deleted feature's baseline."""
        self._previous.pop(feature, None)

    async def read(self, feature: str, models: Sequence[str], window_seconds: float) -> WindowMetrics | None:
        """Increases since the previous read for `feature` (`window_seconds` is only the expected size)."""
        targets = list(self._targets) if isinstance(self._targets, Sequence) else list(await self._targets())
        if not targets:
            raise MetricsUnavailableError("no gateway targets to scrape")
        texts = await asyncio.gather(*(self._scrape(url) for url in targets))
        current = {url: _feature_series(text, feature) for url, text in zip(targets, texts, strict=True) if text}
        if not current:
            raise MetricsUnavailableError(f"none of {len(targets)} gateway targets answered")
        now = self._clock()
        previous = self._previous.get(feature)
        self._previous[feature] = _Snapshot(now, current)
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


def _feature_series(text: str, feature: str) -> dict[SeriesKey, float]:
    series: dict[SeriesKey, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = _KINDS.get(sample.name)
            if kind is None or sample.labels.get("feature") != feature:
                continue
            le = sample.labels.get("le", "") if kind in ("latency", "ttft") else ""
            # Summed over the other labels (code, reason): the analysis needs per-model totals.
            series[(kind, sample.labels.get("model", ""), le)] += float(sample.value)
    return dict(series)


def _windows(increases: dict[SeriesKey, float], models: Sequence[str]) -> dict[str, ModelWindow]:
    def quantile(kind: str, model: str) -> float | None:
        buckets = [(float(le), v) for (k, m, le), v in increases.items() if k == kind and m == model]
        return bucket_quantile(P95, buckets)

    return {
        model: ModelWindow(
            requests=increases.get(("requests", model, ""), 0.0),
            errors=increases.get(("errors", model, ""), 0.0),
            p95_ttft_seconds=quantile("ttft", model),
            p95_latency_seconds=quantile("latency", model),
        )
        for model in models
    }
