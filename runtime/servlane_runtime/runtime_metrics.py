"""The runtime's Prometheus metrics, one registry per app (so tests can run several apps at once).

Names: servlane_runtime_requests_total{endpoint,code}, _in_flight, _queue_depth,
_request_duration_seconds{endpoint}, _time_to_first_token_seconds{endpoint},
_tokens_total{kind=prompt|completion}, _startup_phase_timestamp_seconds{phase} and _startup_seconds{phase}
(the start's phases, servlane_runtime.startup). Buckets are the gateway's, so the two compare directly.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from servlane_api.metric_names import LATENCY_BUCKETS

PREFIX = "servlane_runtime"
# vLLM's own load signals, which its stat logger registers in prometheus_client's global registry (absent on
# the transformers engine): served next to ours, for the operator's autoscaler.
_VLLM_SIGNALS = REGISTRY.restricted_registry(
    ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
)
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models")


class RuntimeMetrics:
    def __init__(self, in_flight: Callable[[], float], queue_depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests by endpoint and status", ["endpoint", "code"], registry=r
        )
        self.latency = Histogram(
            f"{PREFIX}_request_duration_seconds", "Request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to the first generated token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(f"{PREFIX}_tokens", "Prompt and generated tokens", ["kind"], registry=r)
        Gauge(f"{PREFIX}_in_flight", "Requests being served", registry=r).set_function(in_flight)
        Gauge(f"{PREFIX}_queue_depth", "Requests waiting for a slot", registry=r).set_function(queue_depth)
        self.startup_at = Gauge(
            f"{PREFIX}_startup_phase_timestamp_seconds",
            "When the runtime reached each phase of its start (Unix time)",
            ["phase"],
            registry=r,
        )
        self.startup_seconds = Gauge(
            f"{PREFIX}_startup_seconds",
            "Seconds from the process's start to each phase of its start",
            ["phase"],
            registry=r,
        )
        self._process_start: float | None = None

    def record_startup(self, phase: str, at: float) -> None:
        """A StartupClock listener: the phase's time, and its seconds since the process started."""
        if phase == "process_start":
            self._process_start = at
        self.startup_at.labels(phase).set(at)
        if self._process_start is not None:
            self.startup_seconds.labels(phase).set(at - self._process_start)

    def count_tokens(self, prompt: int, completion: int) -> None:
        self.tokens.labels("prompt").inc(prompt)
        self.tokens.labels("completion").inc(completion)

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(_VLLM_SIGNALS)
