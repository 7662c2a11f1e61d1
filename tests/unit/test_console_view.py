"""The console's pure parts: the request log (slow/failed ring, per-model window) and the JSON view, whose
visibility follows /v1/models (no keys: everything; an unscoped key: everything; a scoped key: its scopes)."""

from __future__ import annotations

from typing import Any

import pytest

from servlane_api import AIFeature, AIModel
from servlane_core.routing.routes import build_route_table, resolve_plain_names
from servlane_gateway.access import parse_keys
from servlane_gateway.console.recent import OutcomeWindow, RequestLog, is_failure, p95
from servlane_gateway.console.view import build_view, time_to_ready, trace_url


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def model(name: str, namespace: str = "default", created: str | None = None, ready_at: str | None = None) -> AIModel:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if created:
        meta["creationTimestamp"] = created
    ready = {"type": "Ready", "status": "True", "reason": "Ready", "lastTransitionTime": ready_at}
    status = {"phase": "Ready", "replicas": 2, "readyReplicas": 1, "desiredReplicas": 2, "conditions": [ready]}
    spec = {"source": {"uri": "/models/x"}, "engine": "transformers"}
    return AIModel.model_validate({"kind": "AIModel", "metadata": meta, "spec": spec, "status": status})


def feature(name: str, weights: dict[str, int], namespace: str = "default") -> AIFeature:
    split = [{"model": m, "weight": w} for m, w in weights.items()]
    analyses = [
        {"time": "2026-01-01T00:00:00Z", "step": 0, "canaryModel": "v2", "canaryWeight": 10, "verdict": "advance"},
        {"time": "2026-01-01T00:05:00Z", "step": 1, "canaryModel": "v2", "canaryWeight": 50, "verdict": "rollback",
         "outcome": "fail", "canaryErrorRate": 0.2},
    ]  # fmt: skip
    status = {"phase": "Progressing", "weights": split, "analyses": analyses}
    meta = {"name": name, "namespace": namespace}
    return AIFeature.model_validate({"kind": "AIFeature", "metadata": meta, "spec": {"split": split}, "status": status})


FEATURES = [feature("chat", {"v1": 50, "v2": 50}), feature("secret", {"s1": 100}, namespace="other")]
MODELS = [model("v1"), model("v2"), model("s1", namespace="other"), model("lonely")]
TABLE = resolve_plain_names(build_route_table(FEATURES, MODELS), ["default"])


def test_failures_are_server_side_errors_and_broken_streams_not_client_answers() -> None:
    assert is_failure(500, None)
    assert is_failure(200, "stream_cut")
    assert is_failure(504, "upstream_timeout")
    assert not is_failure(200, None)
    assert not is_failure(404, None)
    assert not is_failure(499, None)


def test_p95_is_the_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([3.0]) == 3.0


def test_the_ring_keeps_the_latest_slow_or_failed_requests_newest_first() -> None:
    clock = Clock()
    log = RequestLog(slow_seconds=2.0, size=2, clock=clock)
    log.add("default", "chat", "v1", 200, 0.1, trace_id="a")  # neither slow nor failed
    log.add("default", "chat", "v1", 500, 0.1, trace_id="b")
    log.add("default", "chat", "v2", 200, 3.0, trace_id="c")
    log.add("default", "chat", "v2", 200, 0.2, "stream_cut", trace_id="d")
    assert [r.trace_id for r in log.recent()] == ["d", "c"]  # bounded: "b" fell out
    assert log.recent()[1].slow
    assert not log.recent()[1].failed


def test_one_features_failures_never_push_anothers_out_of_the_ring() -> None:
    clock = Clock()
    log = RequestLog(slow_seconds=2.0, size=3, clock=clock)
    log.add("team-a", "chat", "v1", 500, 0.1, trace_id="a")
    for i in range(100):  # another team fails its own requests, as many as it likes
        clock.now += 1
        log.add("team-b", "chat", "v1", 500, 0.1, trace_id=f"b{i}")
    clock.now += 1
    log.add("", "", "", 500, 0.1, trace_id="unrouted")
    team_a = log.recent(lambda namespace, feature: namespace == "team-a")
    assert [r.trace_id for r in team_a] == ["a"]
    # Who sees everything sees the newest across the features (and the unrouted), still `size` of them.
    assert [r.trace_id for r in log.recent()] == ["unrouted", "b99", "b98"]
    assert [r.trace_id for r in log.recent(lambda namespace, feature: True)] == ["b99", "b98", "b97"]


def test_a_models_stats_count_only_the_features_the_reader_sees() -> None:
    clock = Clock()
    log = RequestLog(window=60.0, clock=clock)
    clock.now += 120
    for _ in range(2):
        log.add("default", "chat", "v1", 200, 0.1, ttft=0.1)
    for _ in range(3):  # the same AIModel through a feature the reader may not see
        log.add("default", "secret", "v1", 500, 0.1)
    seen = log.stats("default", "v1", lambda namespace, feature: feature == "chat")
    assert (seen.requests, seen.error_rate, seen.ttft_p95_seconds) == (2, 0.0, 0.1)
    assert seen.requests_per_second == 2 / 60
    everything = log.stats("default", "v1")
    assert (everything.requests, everything.error_rate) == (5, 3 / 5)
    assert everything.requests_per_second == pytest.approx(5 / 60)  # summed over the two features' windows


def test_deleted_features_and_idle_windows_are_forgotten() -> None:
    """A tenant that makes, calls and deletes features by the thousand must not fill the gateway's memory."""
    clock = Clock()
    log = RequestLog(window=60.0, clock=clock)
    for i in range(1000):
        log.add("team-b", f"f{i}", "v1", 500, 0.1)
    log.add("default", "chat", "v1", 500, 0.1)
    log.add("", "", "", 503, 0.1)  # resolved to no route
    assert len(log.features_held()) == 1002
    log.keep_only(lambda namespace, feature: f"{namespace}/{feature}" in TABLE.routes)  # team-b's are gone
    assert log.features_held() == {("default", "chat"), ("", "")}
    assert sorted(r.namespace for r in log.recent()) == ["", "default"]
    # A feature that keeps its object but gets no request for a whole window loses its window, not its ring.
    log.add("default", "other", "v1", 200, 0.1)
    clock.now += 61
    log.add("default", "chat", "v1", 200, 0.1, ttft=0.2)
    assert ("default", "other") not in log.features_held()
    assert log.stats("default", "v1").requests == 1
    assert sorted(r.feature for r in log.recent()) == ["", "chat"]


def test_model_stats_cover_the_window_only() -> None:
    clock = Clock()
    log = RequestLog(window=60.0, clock=clock)
    clock.now += 120  # up for longer than the window
    log.add("default", "chat", "v1", 500, 0.1)
    clock.now += 61
    for ttft in (0.1, 0.2, 0.3, 0.4):
        log.add("default", "chat", "v1:adapter", 200, 0.5, ttft=ttft)  # an adapter counts for its AIModel
    log.add("default", "chat", "v1", 503, 0.1)
    stats = log.stats("default", "v1")
    assert stats.requests == 5  # the first 500 is outside the window
    assert stats.error_rate == 1 / 5
    assert stats.requests_per_second == 5 / 60
    assert stats.ttft_p95_seconds == 0.4
    assert log.stats("default", "nothing").error_rate is None


def test_a_full_outcome_window_drops_the_oldest_and_rates_cover_what_it_holds() -> None:
    clock = Clock()
    log = RequestLog(window=300.0, clock=clock, max_outcomes=4)
    clock.now += 1000
    for i in range(6):  # wraps the ring: the first two fall out
        clock.now += 1
        log.add("default", "chat", "v1", 500 if i in (0, 4) else 200, 0.1, ttft=None if i in (0, 4) else i / 10)
    stats = log.stats("default", "v1")
    assert stats.requests == 4
    assert stats.error_rate == 1 / 4  # the failure at i=0 fell out, the one at i=4 did not
    assert stats.ttft_p95_seconds == 0.5
    assert stats.window_seconds == 3.0  # from the oldest kept (i=2) to now (i=5), not the 300 s window
    assert stats.requests_per_second == 4 / 3


def test_outcome_window_expires_across_the_wrap() -> None:
    window = OutcomeWindow(3)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        window.add(t, failed=t == 5.0, ttft=t)
    assert (len(window), window.oldest_time(), window.full()) == (3, 3.0, True)
    window.expire(before=4.5)
    assert (len(window), window.oldest_time(), window.failures(), window.ttfts()) == (1, 5.0, 1, [5.0])
    window.expire(before=10.0)
    assert (len(window), window.oldest_time(), window.ttfts()) == (0, None, [])
    window.add(11.0, failed=False, ttft=None)  # no first token: counted, not a TTFT
    assert (len(window), window.failures(), window.ttfts()) == (1, 0, [])


def test_outcome_window_grows_to_its_capacity_keeping_the_order() -> None:
    window = OutcomeWindow(5, initial=2)
    window.add(1.0, failed=False, ttft=1.0)
    window.add(2.0, failed=True, ttft=None)
    window.expire(before=1.5)  # the oldest index moves: growth must copy from it
    for t in (3.0, 4.0, 5.0, 6.0, 7.0):  # grows 2 -> 4 -> 5, then wraps at capacity
        window.add(t, failed=False, ttft=t)
    assert (len(window), window.full(), window.oldest_time()) == (5, True, 3.0)
    assert (window.failures(), window.ttfts()) == (0, [3.0, 4.0, 5.0, 6.0, 7.0])
    assert len(OutcomeWindow(20_000)._times) == 64  # a window no request filled costs bytes, not 340 kB


def test_time_to_ready_is_ready_transition_minus_creation() -> None:
    assert time_to_ready(model("m", created="2026-01-01T00:00:00Z", ready_at="2026-01-01T00:01:30Z")) == 90.0
    assert time_to_ready(model("m", ready_at="2026-01-01T00:01:30Z")) is None


def test_trace_urls_fill_the_template_only_with_a_trace_id() -> None:
    assert trace_url("http://j/trace/{trace_id}", "ab12") == "http://j/trace/ab12"
    assert trace_url(None, "ab12") is None
    assert trace_url("http://j/trace/{trace_id}", None) is None
    assert trace_url("http://j/trace/{trace_id}", "x/../y") is None


KEY = "k" * 32  # the shortest key a keys file takes


def view_for(keys: str | None, log: RequestLog | None = None) -> dict[str, Any]:
    key = parse_keys(keys)[0] if keys else None
    log = log or RequestLog(clock=Clock())
    return build_view(TABLE, FEATURES, MODELS, log, key, "http://jaeger/trace/{trace_id}")


def names(items: list[dict[str, Any]]) -> set[str]:
    return {f"{i['namespace']}/{i['name']}" for i in items}


def test_without_keys_or_with_an_unscoped_key_everything_shows() -> None:
    for keys in (None, f"admin: {KEY}"):
        view = view_for(keys)
        assert names(view["features"]) == {"default/chat", "other/secret"}
        assert names(view["models"]) == {"default/v1", "default/v2", "other/s1", "default/lonely"}
        assert view["scope"] == "everything"


def test_a_scoped_key_sees_only_its_features_their_models_and_their_requests() -> None:
    log = RequestLog(slow_seconds=1.0, clock=Clock())
    log.add("default", "chat", "v2", 500, 0.1, trace_id="aa")
    log.add("other", "secret", "s1", 500, 0.1, trace_id="bb")
    log.add("", "", "", 500, 0.1, trace_id="cc")  # never routed
    view = view_for(f"team: {KEY} default/chat", log)
    assert names(view["features"]) == {"default/chat"}
    assert names(view["models"]) == {"default/v1", "default/v2"}  # behind chat; not `lonely`, not other/s1
    assert [r["traceId"] for r in view["recent"]] == ["aa"]
    assert view["recent"][0]["traceUrl"] == "http://jaeger/trace/aa"
    assert "secret" not in str(view)
    assert "other" not in str(view)
    direct = view_for(f"team: {KEY} other/s1", log)
    assert names(direct["features"]) == set()
    assert names(direct["models"]) == {"other/s1"}
    assert [r["traceId"] for r in direct["recent"]] == []  # its requests went through the feature
    # ... and so did its traffic: the model's figures for this key count none of the feature's requests.
    assert [(m["name"], m["requests"]) for m in direct["models"]] == [("s1", 0)]
    assert [(m["name"], m["requests"]) for m in view_for(None, log)["models"] if m["name"] == "s1"] == [("s1", 1)]


def test_features_carry_weights_and_canary_history() -> None:
    chat = next(f for f in view_for(None)["features"] if f["name"] == "chat")
    assert chat["weights"] == [{"model": "v1", "weight": 50}, {"model": "v2", "weight": 50}]
    assert [a["verdict"] for a in chat["analyses"]] == ["advance", "rollback"]
    assert chat["analyses"][1]["canaryErrorRate"] == 0.2
    assert chat["phase"] == "Progressing"
