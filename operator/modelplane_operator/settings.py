"""Operator settings, read once from the environment (and CLI flags in main.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field

DEFAULT_RUNTIME_IMAGE = "ghcr.io/modelplane/runtime:0.1.0"


class OperatorSettings(BaseModel):
    runtime_image: str = Field(default=DEFAULT_RUNTIME_IMAGE, description="Image of the runtime pods.")
    namespaces: list[str] = Field(default_factory=list, description="Watched namespaces; empty = all.")
    resync_seconds: float = Field(default=60, gt=0, description="Periodic re-apply, which reverts hand edits.")
    cluster_domain: str = "cluster.local"
    metrics_port: int = 9090
    prometheus_url: str | None = None
    analysis_interval_seconds: float = Field(default=10, gt=0, description="How often canaries are checked.")
    gateway_metrics_urls: list[str] = Field(
        default_factory=list, description="Gateway /metrics URLs to scrape without Prometheus; empty: find the pods."
    )
    gateway_metrics_port: int = Field(default=8080, description="Port of the gateway pods' /metrics.")
    gateway_namespace: str | None = Field(
        default=None, description="Namespace of the gateway pods (a Role suffices to find them); None: all."
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        e = os.environ if env is None else env
        values: dict[str, object] = {}
        if e.get("MODELPLANE_RUNTIME_IMAGE"):
            values["runtime_image"] = e["MODELPLANE_RUNTIME_IMAGE"]
        if e.get("MODELPLANE_GATEWAY_METRICS_URLS"):
            values["gateway_metrics_urls"] = [
                u.strip() for u in e["MODELPLANE_GATEWAY_METRICS_URLS"].split(",") if u.strip()
            ]
        if e.get("MODELPLANE_NAMESPACES"):
            values["namespaces"] = [n.strip() for n in e["MODELPLANE_NAMESPACES"].split(",") if n.strip()]
        for key, field in (
            ("MODELPLANE_RESYNC_SECONDS", "resync_seconds"),
            ("MODELPLANE_CLUSTER_DOMAIN", "cluster_domain"),
            ("MODELPLANE_METRICS_PORT", "metrics_port"),
            ("MODELPLANE_PROMETHEUS_URL", "prometheus_url"),
            ("MODELPLANE_ANALYSIS_INTERVAL_SECONDS", "analysis_interval_seconds"),
            ("MODELPLANE_GATEWAY_METRICS_PORT", "gateway_metrics_port"),
            ("MODELPLANE_GATEWAY_NAMESPACE", "gateway_namespace"),
        ):
            if e.get(key):
                values[field] = e[key]
        return cls.model_validate(values)
