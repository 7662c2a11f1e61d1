"""The gateway's Prometheus metrics: a documented contract read by the canary analysis and dashboards.

Labels: `namespace` (the namespace of the AIFeature, or of the AIModel called directly by its served
name), `feature` (the AIFeature, or the served model name when called directly), `model` (the AIModel
that answered), `code` (HTTP status as a string). The canary readers select on namespace and feature, so
two namespaces with a feature of the same name never mix. Every request is counted once in REQUESTS;
those that failed on the server side (5xx, upstream timeouts, streams cut short, error events inside a
200 stream) are counted again in ERRORS with a `reason`. Error rate over a window = increase(ERRORS) /
increase(REQUESTS). A backend's own 4xx are REQUESTS with that code (and a model); the gateway's own
4xx (auth, rate limits, body too large) have model "" because no backend was picked. One exception: an
attempt whose connection the backend refused, and that the gateway retried on another backend, is
counted as a request of its own against the refused model (code 502, reason upstream_unavailable), so
a dead version shows as failing. LATENCY and TTFT observe successful requests only, so fast failures
cannot make a version look quick. Every route's series exist from the moment the gateway learns the
route, at 0. The gateway scrape config must keep these labels (honor_labels: true), since Prometheus'
own `namespace` target label would otherwise rename ours to exported_namespace.
"""

from __future__ import annotations

REQUESTS = "servlane_gateway_requests_total"  # counter: namespace, feature, model, code
ERRORS = "servlane_gateway_request_errors_total"  # counter: namespace, feature, model, reason
ERROR_REASONS = ("status_5xx", "upstream_timeout", "stream_aborted", "stream_error", "upstream_unavailable")
LATENCY = "servlane_gateway_request_duration_seconds"  # histogram: namespace, feature, model (successes)
TTFT = "servlane_gateway_time_to_first_token_seconds"  # histogram: namespace, feature, model (successes)
TOKENS = "servlane_gateway_tokens_total"  # counter: namespace, feature, model, kind=prompt|completion
ADDED_LATENCY = "servlane_gateway_added_latency_seconds"  # histogram: the gateway's own overhead
WEIGHT = "servlane_gateway_route_weight"  # gauge: namespace, feature, model — the weight the gateway applies
# counter: namespace, feature, model — sticky requests routed by weight because their client was over its
# share of that model's recent requests (servlane_core.routing.sticky_share)
STICKY_UNPINNED = "servlane_gateway_sticky_unpinned_total"
# gauge: mode=memory|redis, always 1 — where this gateway keeps its rate limits and quotas (memory: each
# replica its own; redis: shared by the replicas)
LIMITS_STORE = "servlane_gateway_limits_store_info"
CLIENT_CLOSED_CODE = "499"  # the code of a request the client abandoned: neither the backend's 4xx nor a failure

# Histogram buckets (seconds) shared by LATENCY and TTFT, so p95 is comparable across versions.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
