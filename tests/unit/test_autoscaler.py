"""The autoscaler at the edge: what it reads from a pod's metrics port, what a pass writes (status.autoscaler
and the Deployment's replicas, never the spec), and which Leases count as demand."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from servlane_core.scaling.demand import demanded_model, is_fresh, renewed_at
from servlane_operator.aimodel_reconciler import reconcile
from servlane_operator.autoscaler import (
    MAX_METRICS_BYTES,
    Autoscaler,
    ReadyPod,
    autoscale,
    parse_signals,
    record_rollout_pin,
    status_needs_write,
    status_of,
)
from servlane_operator.settings import OperatorSettings
from tests.support.autoscaling import (
    IDLE_METRICS,
    NAME,
    NS,
    live_deployment,
    model_body,
    pod,
    quiet_events,  # noqa: F401 - fixtures
    scraper,
)
from tests.unit.fake_kube import FakeKube

DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/model-{NAME}"
MODEL = f"/apis/servlane.dev/v1alpha1/namespaces/{NS}/aimodels/{NAME}"

VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.75
# TYPE servlane_runtime_in_flight gauge
servlane_runtime_in_flight 8.0
# TYPE servlane_runtime_requests counter
servlane_runtime_requests_total{code="200",endpoint="/v1/chat/completions"} 41.0
servlane_runtime_requests_total{code="200",endpoint="/v1/models"} 1000.0
"""
RUNTIME_METRICS = """\
# TYPE servlane_runtime_in_flight gauge
servlane_runtime_in_flight 2.0
# TYPE servlane_runtime_queue_depth gauge
servlane_runtime_queue_depth 1.0
# TYPE servlane_runtime_requests counter
servlane_runtime_requests_total{code="200",endpoint="/v1/chat/completions"} 7.0
servlane_runtime_requests_total{code="400",endpoint="/v1/embeddings"} 2.0
"""


def test_vllm_signals_are_the_engines_own() -> None:
    signals = parse_signals(VLLM_METRICS)
    assert signals is not None
    assert (signals.running, signals.waiting, signals.kv_cache_usage) == (5.0, 3.0, 0.75)
    assert signals.requests_total == 41.0  # listing models is no use of the model


def test_the_transformers_engine_is_read_from_the_runtimes_gauges() -> None:
    signals = parse_signals(RUNTIME_METRICS)
    assert signals is not None
    assert (signals.running, signals.waiting, signals.kv_cache_usage, signals.requests_total) == (2, 1, None, 9)


@pytest.mark.parametrize("text", ["", "# nothing\n", "servlane_runtime_in_flight NaN\n"])
def test_a_pod_without_usable_signals_reports_nothing(text: str) -> None:
    assert parse_signals(text) is None


def test_only_ready_pods_with_an_address_that_are_not_leaving_are_read() -> None:
    ready = {"type": "Ready", "status": "True"}
    body: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"podIP": "10.1.2.3", "conditions": [ready]}}
    assert ReadyPod.parse(body) == ReadyPod("p", "10.1.2.3")
    assert ReadyPod.parse({**body, "status": {"conditions": [ready]}}) is None
    assert ReadyPod.parse({**body, "status": {"podIP": "10.1.2.3", "conditions": []}}) is None
    leaving = {**body, "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert ReadyPod.parse(leaving) is None


def test_an_endless_metrics_body_is_cut_off_not_read_whole() -> None:
    """A hostile pod answering with more than MAX_METRICS_BYTES gives no signals (and no memory blow-up)."""
    huge = b"servlane_runtime_in_flight 1\n" + b"#" * (MAX_METRICS_BYTES + 1)
    autoscaler = scraper(lambda request: httpx.Response(200, content=huge))
    assert asyncio.run(autoscaler.read([pod()])) == {}
    fine = scraper(lambda request: httpx.Response(200, text=RUNTIME_METRICS))
    assert set(asyncio.run(fine.read([pod()]))) == {"p1"}


def run_pass(kube: FakeKube, body: dict[str, Any], autoscaler: Autoscaler, current: int, **kw: Any) -> Any:
    settings = OperatorSettings(gateway_namespace="gw")
    kw.setdefault("demand", False)
    kw.setdefault("pinned", None)
    pods = kw.pop("ready", [pod()] if current else [])
    return asyncio.run(autoscale(body, kube, settings, autoscaler, live_deployment(current), pods, [], **kw))


@pytest.mark.usefixtures("quiet_events")
def test_a_busy_model_is_scaled_up_in_its_deployment_and_status_not_its_spec() -> None:
    kube = FakeKube()
    body = model_body({"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetInFlightPerReplica": 1}})
    autoscaler = scraper(lambda request: httpx.Response(200, text=RUNTIME_METRICS))  # 3 in flight or waiting
    decision = run_pass(kube, body, autoscaler, 1)
    assert (decision.replicas, decision.reason) == (3, "HighLoad")
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 3
    written = [s["autoscaler"] for s in kube.statuses if "autoscaler" in s]
    assert written[0]["desiredReplicas"] == 3
    assert ("PATCH", MODEL) not in kube.calls  # the spec is the user's (or kubectl scale's), never ours


@pytest.mark.usefixtures("quiet_events")
def test_an_idle_model_at_min_zero_goes_to_zero_after_its_window() -> None:
    kube = FakeKube()
    spec = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfter": "10m"}}
    last_seen = {"desiredReplicas": 1, "reason": "AtTarget", "lastActivityTime": "1970-01-12T13:46:40Z"}  # 1e6 s
    idle = scraper(lambda request: httpx.Response(200, text=IDLE_METRICS))
    idle.totals[(NS, NAME)] = {"p1": 9.0}  # nothing counted since the last read
    idle.clock = lambda: 1_000_000.0 + 599
    assert run_pass(kube, model_body(spec, {"autoscaler": last_seen}), idle, 1).replicas == 1
    idle.clock = lambda: 1_000_000.0 + 601
    decision = run_pass(kube, model_body(spec, {"autoscaler": last_seen}), idle, 1)
    assert (decision.replicas, decision.reason) == (0, "Idle")
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 0


@pytest.mark.usefixtures("quiet_events")
def test_demand_wakes_a_model_at_zero_without_reading_any_pod() -> None:
    kube = FakeKube()
    spec = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}

    def no_pod_to_read(request: httpx.Request) -> httpx.Response:
        raise AssertionError("a model at zero has no pod to read")

    autoscaler = scraper(no_pod_to_read)
    body = model_body(spec, {"autoscaler": {"desiredReplicas": 0, "reason": "Idle"}})
    assert run_pass(kube, body, autoscaler, 0).replicas == 0  # no demand: stays
    decision = run_pass(kube, body, autoscaler, 0, demand=True)
    assert (decision.replicas, decision.reason) == (1, "Demand")
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 1


@pytest.mark.usefixtures("quiet_events")
def test_a_rollout_pin_is_left_to_the_budget_reconcile() -> None:
    kube = FakeKube()
    autoscaler = scraper(lambda request: httpx.Response(200, text=RUNTIME_METRICS))
    body = model_body({"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetInFlightPerReplica": 1}})
    decision = run_pass(kube, body, autoscaler, 2, pinned=2)
    assert (decision.replicas, decision.reason) == (2, "FixedGpuBudget")
    assert DEPLOYMENT not in kube.objects  # the AIFeature's budget applies the pin, not the autoscaler


@pytest.mark.usefixtures("quiet_events")
def test_a_released_model_resumes_from_its_last_pin_not_an_older_decision() -> None:
    """Seen in CI: a canary at minReplicas 2 was pinned to 1, then to 2 at 100 %, and released before the
    next autoscaler pass had seen the second pin: the Deployment went back to 1 for one pass. Every pin is
    the model's decision as the budget applies it, and the release resumes from the last one."""
    kube = FakeKube()
    spec = {"autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    autoscaler = Autoscaler(clock=lambda: 1_000_000.0)
    settings = OperatorSettings(gateway_namespace="gw")
    before = model_body(spec, {"autoscaler": {"desiredReplicas": 2, "reason": "AtTarget"}})

    def budget_applies(pinned: int | None, released_from: int | None) -> int:
        # What handlers.feature_pass does for each model whose pin moved.
        body = autoscaler.with_decision(before)  # the index's copy: older than every decision since
        asyncio.run(record_rollout_pin(body, kube, autoscaler, pinned=pinned, released_from=released_from))
        current = autoscaler.with_decision(body, 2)
        asyncio.run(reconcile(current, kube, settings, [], trigger="budget", replicas_override=pinned))
        return int(kube.objects[DEPLOYMENT]["spec"]["replicas"])

    assert budget_applies(1, None) == 1
    assert kube.statuses[-1]["autoscaler"]["reason"] == "FixedGpuBudget"
    idle = scraper(lambda request: httpx.Response(200, text=IDLE_METRICS))
    autoscaler.client = idle.client
    run_pass(kube, before, autoscaler, 1, pinned=1)  # a periodic pass while the first pin holds
    assert budget_applies(2, 1) == 2
    assert budget_applies(None, 2) == 2  # released: its own count resumes from the pin, not from 1
    written = kube.statuses[-1]["autoscaler"]
    assert (written["desiredReplicas"], written["reason"]) == (2, "RolloutReleased")
    assert written["lastBusyTime"] == "1970-01-12T13:46:40Z"  # a full scale-down window from the release


@pytest.mark.usefixtures("quiet_events")
def test_a_pin_the_deployment_does_not_run_yet_is_not_recorded_by_the_periodic_pass() -> None:
    """The periodic pass reads the pin from the feature index, which may be behind the budget reconcile:
    a pin the Deployment does not run is left to that reconcile, not recorded over the newer one."""
    kube = FakeKube()
    autoscaler = scraper(lambda request: httpx.Response(200, text=IDLE_METRICS))
    body = model_body({"autoscaling": {"minReplicas": 2, "maxReplicas": 4}})
    asyncio.run(record_rollout_pin(body, kube, autoscaler, pinned=2, released_from=1))
    stale = run_pass(kube, body, autoscaler, 2, pinned=1)
    assert stale.replicas == 1  # the stale pin is what the index said ...
    assert autoscaler.with_decision(body)["status"]["autoscaler"]["desiredReplicas"] == 2  # ... not recorded
    assert DEPLOYMENT not in kube.objects


def test_status_is_written_for_a_new_count_or_reason_or_times_that_moved_far() -> None:
    from servlane_core.scaling import Decision, ScalingState

    base = status_of(Decision(2, "AtTarget", "", ScalingState(100.0, 100.0, 100.0)))
    assert not status_needs_write(base, status_of(Decision(2, "AtTarget", "", ScalingState(100.0, 120.0, 110.0))))
    assert status_needs_write(base, status_of(Decision(2, "AtTarget", "", ScalingState(100.0, 140.0, 100.0))))
    assert status_needs_write(base, status_of(Decision(3, "HighLoad", "", ScalingState(100.0, 100.0, 100.0))))
    assert status_needs_write(None, base)


def test_a_lease_wakes_only_the_model_it_is_named_after() -> None:
    gateway = {"app.kubernetes.io/managed-by": "servlane-gateway", "servlane.dev/model": "llama"}
    assert demanded_model("servlane-demand-llama", gateway) == "llama"
    assert demanded_model("servlane-demand-other", gateway) is None  # named after another model
    assert demanded_model("servlane-demand-llama", {**gateway, "app.kubernetes.io/managed-by": "x"}) is None
    assert demanded_model("servlane-demand-llama", {"app.kubernetes.io/managed-by": "servlane-gateway"}) is None
    lease = {"spec": {"renewTime": "2026-12-05T04:00:00.123456Z"}}
    renewed = renewed_at(lease)
    assert renewed is not None
    assert is_fresh(renewed, renewed + 60)
    assert not is_fresh(renewed, renewed + 61)
    assert renewed_at({"spec": {}}) is None
    assert renewed_at({"spec": {"renewTime": "yesterday"}}) is None


@pytest.mark.usefixtures("quiet_events")
def test_a_copy_of_the_model_older_than_the_decision_does_not_undo_it() -> None:
    """A resync or spec change reconciles the AIModel from an index or event copy, which may predate the
    status patch of the last decision: the decision this process made is what the Deployment keeps."""
    kube = FakeKube()
    spec = {"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetInFlightPerReplica": 1}}
    autoscaler = scraper(lambda request: httpx.Response(200, text=RUNTIME_METRICS))
    run_pass(kube, model_body(spec), autoscaler, 1)  # scaled to 3
    stale = model_body(spec, {"autoscaler": {"desiredReplicas": 1, "reason": "AtTarget"}})
    current = autoscaler.with_decision(stale)
    assert current["status"]["autoscaler"]["desiredReplicas"] == 3
    settings = OperatorSettings(gateway_namespace="gw")
    asyncio.run(reconcile(current, kube, settings, [], trigger="resync"))
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 3
    fixed = model_body({"replicas": 2})
    assert autoscaler.with_decision(fixed) is fixed  # a model without autoscaling: spec.replicas rules
    autoscaler.forget((NS, NAME))
    assert autoscaler.with_decision(stale) is stale


@pytest.mark.usefixtures("quiet_events")
def test_turning_autoscaling_on_keeps_the_live_count_until_the_first_pass() -> None:
    """No decision yet (autoscaling just turned on, or an operator whose HPA held the replicas): the
    Deployment's live count stands in, within the bounds, rather than the minimum."""
    autoscaler = Autoscaler()
    spec = {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}
    seeded = autoscaler.with_decision(model_body(spec), live_replicas=3)
    assert seeded["status"]["autoscaler"] == {"desiredReplicas": 3}
    settings = OperatorSettings(gateway_namespace="gw")
    kube = FakeKube()
    asyncio.run(reconcile(seeded, kube, settings, [], trigger="resync"))
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 3
    decided = model_body(spec, {"autoscaler": {"desiredReplicas": 2}})
    assert autoscaler.with_decision(decided, live_replicas=3) is decided  # a decision in status wins
    new = model_body(spec)
    assert autoscaler.with_decision(new, live_replicas=None) is new  # no Deployment yet: the minimum


def test_the_runtime_serves_vllms_own_signals_where_the_autoscaler_reads_them() -> None:
    """vLLM registers its series in prometheus_client's global registry; the runtime's metrics port serves
    the load signals among them next to its own, and the autoscaler prefers them."""
    from prometheus_client import REGISTRY, Gauge

    from servlane_runtime.runtime_metrics import RuntimeMetrics

    running = Gauge("vllm:num_requests_running", "running", ["model_name"])
    usage = Gauge("vllm:kv_cache_usage_perc", "KV cache", ["model_name"])
    try:
        running.labels("llama").set(6)
        usage.labels("llama").set(0.5)
        text = RuntimeMetrics(in_flight=lambda: 9, queue_depth=lambda: 0).render().decode()
        signals = parse_signals(text)
        assert signals is not None
        assert (signals.running, signals.kv_cache_usage) == (6, 0.5)
        assert "python_gc" not in text  # only vLLM's load signals come from the global registry
    finally:
        REGISTRY.unregister(running)
        REGISTRY.unregister(usage)
