"""The operator's context: everything its handlers and loops share, made once and passed as kopf's memo.

kopf hands every resource a `copy.copy` of the operator's memo. Here the copy is the context itself
(`__copy__`), so a task list or a queue filled from one object's handler is the one every other handler
sees, and each field keeps its type instead of kopf.Memo's `Any`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from servlane_core.rollout import MetricsReader
from servlane_operator.autoscaler import Autoscaler
from servlane_operator.cold_start_reader import ColdStartReader
from servlane_operator.kube import Kube, load_client
from servlane_operator.labels import GATEWAY_SELECTOR
from servlane_operator.lanes import Lanes
from servlane_operator.metric_readers.prometheus_reader import PrometheusReader
from servlane_operator.metric_readers.scrape_reader import ScrapeReader
from servlane_operator.object_locks import ObjectLocks
from servlane_operator.settings import OperatorSettings
from servlane_operator.written_status import WrittenStatuses

ModelKey = tuple[str, str]


class Peering(Protocol):
    """What the periodic loops read of kopf's peering settings (kopf fills them in from kopf.run)."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def standalone(self) -> bool: ...


@dataclass(eq=False)
class OperatorContext:
    settings: OperatorSettings
    kube: Kube
    reader: MetricsReader
    lanes: Lanes
    autoscaler: Autoscaler
    cold_starts: ColdStartReader
    locks: ObjectLocks = field(default_factory=ObjectLocks)
    feature_statuses: WrittenStatuses = field(default_factory=WrittenStatuses)
    peering: Peering | None = None  # kopf's, from the startup handler
    periodic: list[asyncio.Task[None]] = field(default_factory=list)
    # Status refreshes waiting for a slot, by model (status_refresh.py), and their running tasks (the loop
    # keeps only weak references to tasks).
    refreshing: dict[ModelKey, bool] = field(default_factory=dict)
    refresh_tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __copy__(self) -> OperatorContext:
        return self  # one context for the operator: see the module's docstring

    @classmethod
    def create(cls, settings: OperatorSettings, kube: Kube | None = None) -> OperatorContext:
        kube = kube if kube is not None else Kube(load_client())
        return cls(
            settings=settings,
            kube=kube,
            reader=canary_reader(settings, kube),
            lanes=Lanes(settings.max_concurrent_reconciles),
            autoscaler=Autoscaler(),
            cold_starts=ColdStartReader(kube),
        )


def canary_reader(settings: OperatorSettings, kube: Kube) -> MetricsReader:
    """Prometheus when configured, else the gateway pods' /metrics scraped directly."""
    if settings.prometheus_url:
        return PrometheusReader(
            settings.prometheus_url,
            job=settings.prometheus_gateway_job,
            scrape_interval_seconds=settings.prometheus_scrape_interval_seconds,
        )
    # Without Prometheus the window is the time between two reads: at least one analysis timer tick.
    min_window = settings.analysis_interval_seconds
    if settings.gateway_metrics_urls:
        return ScrapeReader(list(settings.gateway_metrics_urls), min_window_seconds=min_window)

    async def gateway_pods() -> list[str]:
        pods = await kube.list_pods(GATEWAY_SELECTOR, settings.gateway_namespace)
        ips = [p["status"].get("podIP") for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return [f"http://{ip}:{settings.gateway_metrics_port}/metrics" for ip in ips if ip]

    return ScrapeReader(gateway_pods, min_window_seconds=min_window)
