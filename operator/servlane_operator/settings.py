"""Operator settings, read once from the environment (and CLI flags in main.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field

DEFAULT_RUNTIME_IMAGE_GPU = "ghcr.io/servlane/runtime:0.1.0-cuda"
DEFAULT_RUNTIME_IMAGE_CPU = "ghcr.io/servlane/runtime:0.1.0-cpu"
# The single-image setting these two replaced; still set means a stale configuration.
REMOVED_RUNTIME_IMAGE_VAR = "SERVLANE_RUNTIME_IMAGE"
REMOVED_RUNTIME_IMAGE_MESSAGE = (
    f"{REMOVED_RUNTIME_IMAGE_VAR} is no longer supported: the runtime image now depends on the AIModel. "
    "Set SERVLANE_RUNTIME_IMAGE_GPU (models with resources.gpus > 0, a CUDA image) and/or "
    f"SERVLANE_RUNTIME_IMAGE_CPU (all other models, a CPU image) instead, and unset {REMOVED_RUNTIME_IMAGE_VAR}."
)
# The job of the chart's ServiceMonitor for a release named servlane: the Prometheus operator names a
# ServiceMonitor's job after the Service, here the gateway's metrics Service.
DEFAULT_PROMETHEUS_GATEWAY_JOB = "servlane-gateway-metrics"


class OperatorSettings(BaseModel):
    runtime_image_gpu: str = Field(
        default=DEFAULT_RUNTIME_IMAGE_GPU,
        min_length=1,
        description="Runtime image of AIModels with resources.gpus > 0 (CUDA vLLM) unless spec.image is set.",
    )
    runtime_image_cpu: str = Field(
        default=DEFAULT_RUNTIME_IMAGE_CPU,
        min_length=1,
        description="Runtime image of AIModels without GPUs (CPU vLLM) unless spec.image is set.",
    )
    namespaces: list[str] = Field(default_factory=list, description="Watched namespaces; empty = all.")
    resync_seconds: float = Field(default=60, gt=0, description="Periodic re-apply, which reverts hand edits.")
    max_concurrent_reconciles: int = Field(
        default=16,
        ge=1,
        description="AIModel reconciles and status writes in flight at once; the rest wait by priority "
        "(spec edits first, periodic resyncs last), see lanes.py.",
    )
    cluster_domain: str = "cluster.local"
    metrics_port: int = 9090
    prometheus_url: str | None = None
    prometheus_scrape_interval_seconds: float = Field(
        default=15,
        gt=0,
        description="How often Prometheus scrapes the gateway: canary windows shorter than two scrapes are raised.",
    )
    prometheus_gateway_job: str = Field(
        default=DEFAULT_PROMETHEUS_GATEWAY_JOB,
        min_length=1,
        description="The `job` label of Prometheus' scrape of the gateway pods; the canary queries select it, so "
        "series of the same names from any other target (a tenant's pod, its own monitor) never enter the analysis.",
    )
    analysis_interval_seconds: float = Field(default=10, gt=0, description="How often canaries are checked.")
    autoscale_interval_seconds: float = Field(
        default=5,
        gt=0,
        description="How often the autoscaler reads the autoscaled models' pods and decides their replicas "
        "(a demand Lease wakes a model at zero at once, without waiting for it).",
    )
    gateway_metrics_urls: list[str] = Field(
        default_factory=list, description="Gateway /metrics URLs to scrape without Prometheus; empty: find the pods."
    )
    gateway_metrics_port: int = Field(
        default=9090, description="Port of the gateway pods' /metrics (the gateway's --metrics-port)."
    )
    gateway_namespace: str | None = Field(
        default=None, description="Namespace of the gateway pods (a Role suffices to find them); None: all."
    )
    model_network_policy: bool = Field(
        default=True,
        description="Give every AIModel a NetworkPolicy admitting its serving port only from the gateway pods "
        "(in gateway_namespace) and the metrics scraper. Off for clusters without a NetworkPolicy controller.",
    )
    operator_namespace: str | None = Field(
        default=None,
        min_length=1,
        description="Namespace of the operator's own pods, admitted by the AIModels' NetworkPolicies to the "
        "model pods' metrics port (its autoscaler reads them there); None: not admitted, and where "
        "NetworkPolicies are enforced the autoscaler then holds every model's count (it reads no signals).",
    )
    metrics_scraper_namespace: str | None = Field(
        default=None,
        min_length=1,
        description="Namespace of whatever scrapes the model pods' /metrics (e.g. Prometheus), admitted by the "
        "AIModels' NetworkPolicies to their metrics port only; None: no scraper is admitted (only the gateway).",
    )
    tracing_otlp_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description="OTLP/HTTP endpoint the model pods export their traces to; None: no tracing in model pods.",
    )
    tracing_sampling_ratio: float = Field(
        default=1.0, ge=0, le=1, description="Share of new traces the model pods keep (a caller's decision wins)."
    )
    metrics_scraper_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Pod labels of the metrics scraper within metrics_scraper_namespace; empty: any pod there.",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        """Raises ValueError (pydantic's ValidationError is one) for a setting that cannot be used."""
        e = os.environ if env is None else env
        if REMOVED_RUNTIME_IMAGE_VAR in e:
            raise ValueError(REMOVED_RUNTIME_IMAGE_MESSAGE)
        values: dict[str, object] = {}
        if e.get("SERVLANE_GATEWAY_METRICS_URLS"):
            values["gateway_metrics_urls"] = [
                u.strip() for u in e["SERVLANE_GATEWAY_METRICS_URLS"].split(",") if u.strip()
            ]
        if e.get("SERVLANE_METRICS_SCRAPER_LABELS"):
            values["metrics_scraper_labels"] = parse_labels(e["SERVLANE_METRICS_SCRAPER_LABELS"])
        if e.get("SERVLANE_NAMESPACES"):
            values["namespaces"] = [n.strip() for n in e["SERVLANE_NAMESPACES"].split(",") if n.strip()]
        for key, field in (
            ("SERVLANE_RUNTIME_IMAGE_GPU", "runtime_image_gpu"),
            ("SERVLANE_RUNTIME_IMAGE_CPU", "runtime_image_cpu"),
            ("SERVLANE_RESYNC_SECONDS", "resync_seconds"),
            ("SERVLANE_MAX_CONCURRENT_RECONCILES", "max_concurrent_reconciles"),
            ("SERVLANE_CLUSTER_DOMAIN", "cluster_domain"),
            ("SERVLANE_METRICS_PORT", "metrics_port"),
            ("SERVLANE_PROMETHEUS_URL", "prometheus_url"),
            ("SERVLANE_PROMETHEUS_SCRAPE_INTERVAL_SECONDS", "prometheus_scrape_interval_seconds"),
            ("SERVLANE_PROMETHEUS_GATEWAY_JOB", "prometheus_gateway_job"),
            ("SERVLANE_ANALYSIS_INTERVAL_SECONDS", "analysis_interval_seconds"),
            ("SERVLANE_AUTOSCALE_INTERVAL_SECONDS", "autoscale_interval_seconds"),
            ("SERVLANE_GATEWAY_METRICS_PORT", "gateway_metrics_port"),
            ("SERVLANE_GATEWAY_NAMESPACE", "gateway_namespace"),
            ("SERVLANE_MODEL_NETWORK_POLICY", "model_network_policy"),
            ("SERVLANE_METRICS_SCRAPER_NAMESPACE", "metrics_scraper_namespace"),
            ("SERVLANE_OPERATOR_NAMESPACE", "operator_namespace"),
            ("SERVLANE_TRACING_OTLP_ENDPOINT", "tracing_otlp_endpoint"),
            ("SERVLANE_TRACING_SAMPLING_RATIO", "tracing_sampling_ratio"),
        ):
            if e.get(key):
                values[field] = e[key]
        return cls.model_validate(values)

    def unscoped_gateway_trust(self) -> str | None:
        """Why these settings would take any pod wearing the gateway's labels, in any namespace, for the
        gateway, or None. A tenant can label its own pods so: its pod would then pass every model's
        NetworkPolicy, or be scraped as a gateway and feed made-up numbers into another team's canary."""
        if self.gateway_namespace:
            return None
        uses = []
        if self.model_network_policy:
            uses.append("the AIModels' NetworkPolicies admit the gateway pods of that namespace only")
        if not self.prometheus_url and not self.gateway_metrics_urls:
            uses.append("the canary analysis scrapes the gateway pods of that namespace only")
        if not uses:
            return None
        return (
            "SERVLANE_GATEWAY_NAMESPACE (the gateway's namespace) is required: "
            + "; ".join(uses)
            + ". Without it, pods with the gateway's labels in any namespace would be trusted as the gateway."
        )


def parse_labels(text: str) -> dict[str, str]:
    """`key=value,key2=value2` (a label selector of equalities only). Raises ValueError on anything else."""
    labels: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or "=" in value or key.strip().endswith("!"):
            raise ValueError(f"not a key=value label: {item!r}")
        labels[key.strip()] = value.strip()
    return labels
