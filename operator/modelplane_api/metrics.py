"""The gateway's Prometheus metrics: a documented contract read by the canary analysis and dashboards.

Labels: `feature` (the AIFeature, or the served model name when called directly), `model` (the AIModel
that answered), `code` (HTTP status as a string). Every request is counted once in REQUESTS; those that
failed on the server side (5xx, upstream timeouts, streams cut short) are counted again in ERRORS with
a `reason`. Error rate over a window = increase(ERRORS) / increase(REQUESTS). One exception: an attempt
whose connection the backend refused, and that the gateway retried on another backend, is counted as a
request of its own against the refused model (code 502, reason upstream_unavailable), so a dead version
shows as failing. Every route's series exist from the moment the gateway learns the route, at 0.
"""

from __future__ import annotations

REQUESTS = "modelplane_gateway_requests_total"  # counter: feature, model, code
ERRORS = "modelplane_gateway_request_errors_total"  # counter: feature, model, reason
ERROR_REASONS = ("status_5xx", "upstream_timeout", "stream_aborted", "upstream_unavailable")
LATENCY = "modelplane_gateway_request_duration_seconds"  # histogram: feature, model
TTFT = "modelplane_gateway_time_to_first_token_seconds"  # histogram: feature, model
TOKENS = "modelplane_gateway_tokens_total"  # counter: feature, model, kind=prompt|completion
ADDED_LATENCY = "modelplane_gateway_added_latency_seconds"  # histogram: the gateway's own overhead
WEIGHT = "modelplane_gateway_route_weight"  # gauge: feature, model — the weight the gateway applies

# Histogram buckets (seconds) shared by LATENCY and TTFT, so p95 is comparable across versions.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
