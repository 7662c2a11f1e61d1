"""The Batch API's Prometheus collectors, in the gateway's registry (so /metrics serves them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REQUESTS = "servlane_gateway_batch_requests_total"
IN_FLIGHT = "servlane_gateway_batch_in_flight"
BATCHES = "servlane_gateway_batch_batches_total"
LINES_INVALID = "servlane_gateway_batch_invalid_lines_total"

SUCCEEDED = "succeeded"  # a 2xx answer, in the output file
FAILED = "failed"  # another answer, in the error file
RETRIED = "retried"  # given back to the queue (429/503 from quotas or backends, transient 5xx)
DUPLICATE = "duplicate"  # answered, but its result was recorded already (another worker) or the batch ended


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            REQUESTS.removesuffix("_total"), "Batch requests sent through the gateway, by outcome.",
            ["namespace", "feature", "outcome"], registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            IN_FLIGHT, "Batch requests this replica is sending now.", ["namespace", "feature"], registry=registry,
            multiprocess_mode="livesum",  # with worker processes: the sum over the live ones
        )  # fmt: skip
        self.batches = Counter(
            BATCHES.removesuffix("_total"), "Batches this replica moved to a final or working status, by status.",
            ["status"], registry=registry,
        )  # fmt: skip
        self.invalid_lines = Counter(
            LINES_INVALID.removesuffix("_total"), "Input lines that went to a batch's error file unsent.",
            registry=registry,
        )  # fmt: skip
