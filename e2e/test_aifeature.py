"""AIFeature canaries against a real API server: the operator reads gateway-contract metrics, moves
traffic step by step, promotes a healthy canary, rolls back a failing one, and honours GPU budgets."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest
from kubernetes import watch

from tests.support.cluster_harness import Kube, OperatorProcess, wait_until
from tests.support.gateway_endpoint import GatewayMetrics

pytestmark = pytest.mark.e2e

CPU_MODEL: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "1"}}
FAST_ROLLOUT = {"steps": [50, 100], "interval": "1s", "analysis": {"maxErrorRate": 0.1, "minRequests": 5}}


def model_ready(kube: Kube, ns: str, name: str) -> bool:
    return kube.phase(ns, name) == "Ready"


def models(kube: Kube, ns: str, *names: str, spec: dict[str, Any] = CPU_MODEL) -> None:
    for name in names:
        kube.create_model(ns, name, spec)
    for name in names:
        wait_until(f"{name} Ready", partial(model_ready, kube, ns, name), timeout=60)


def status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.get_feature(ns, name).get("status") or {}


def traffic(metrics: GatewayMetrics, ns: str, feature: str, stable: str, canary: str, canary_errors: bool) -> None:
    """A burst of finished requests as the gateway would count them (its series carry the namespace)."""
    for i in range(10):
        metrics.serve(feature, stable, latency=0.2, ttft=0.05, namespace=ns)
        metrics.serve(feature, canary, latency=0.2, ttft=0.05, error=canary_errors and i % 2 == 0, namespace=ns)


def test_a_healthy_canary_is_promoted_step_by_step(
    kube: Kube, operator: OperatorProcess, gateway_metrics: GatewayMetrics, namespace: str
) -> None:
    feature = f"chat-{namespace}"
    models(kube, namespace, "v1", "v2")
    for model in ("v1", "v2"):
        gateway_metrics.declare(feature, model, namespace=namespace)
    kube.create_feature(namespace, feature, {"model": "v1", "rollout": FAST_ROLLOUT})
    first = wait_until("v1 stable", lambda: (s := status(kube, namespace, feature)).get("phase") == "Stable" and s)
    assert first["stableModel"] == "v1"
    assert first["weights"] == [{"model": "v1", "weight": 100}]

    kube.patch_feature(namespace, feature, {"spec": {"model": "v2"}})
    seen_weights: set[int] = set()

    def promoted() -> bool:
        traffic(gateway_metrics, namespace, feature, "v1", "v2", canary_errors=False)
        s = status(kube, namespace, feature)
        if s.get("canaryWeight") is not None:
            seen_weights.add(s["canaryWeight"])
        return s.get("phase") == "Stable" and s.get("stableModel") == "v2"

    wait_until("v2 promoted", promoted, timeout=60, interval=0.3)
    assert 50 in seen_weights
    final = status(kube, namespace, feature)
    assert final["weights"] == [{"model": "v2", "weight": 100}]
    assert any(a["verdict"] in ("advance", "promote") for a in final["analyses"])


def test_a_canary_between_adapters_of_one_model_is_promoted(
    kube: Kube, operator: OperatorProcess, gateway_metrics: GatewayMetrics, namespace: str
) -> None:
    feature = f"sql-{namespace}"
    adapters = [{"name": "sql-v1", "source": "/adapters/v1"}, {"name": "sql-v2", "source": "/adapters/v2"}]
    models(kube, namespace, "base", spec={**CPU_MODEL, "adapters": adapters})
    for target in ("base:sql-v1", "base:sql-v2"):
        gateway_metrics.declare(feature, target, namespace=namespace)
    kube.create_feature(namespace, feature, {"model": "base:sql-v1", "rollout": FAST_ROLLOUT})
    wait_until("sql-v1 stable", lambda: status(kube, namespace, feature).get("stableModel") == "base:sql-v1")

    kube.patch_feature(namespace, feature, {"spec": {"model": "base:sql-v2"}})

    def promoted() -> bool:
        traffic(gateway_metrics, namespace, feature, "base:sql-v1", "base:sql-v2", canary_errors=False)
        s = status(kube, namespace, feature)
        return s.get("phase") == "Stable" and s.get("stableModel") == "base:sql-v2"

    wait_until("sql-v2 promoted", promoted, timeout=60, interval=0.3)
    final = status(kube, namespace, feature)
    assert final["weights"] == [{"model": "base:sql-v2", "weight": 100}]
    assert any(a["verdict"] == "promote" and a["canaryModel"] == "base:sql-v2" for a in final["analyses"])
    assert not final.get("replicaOverrides"), final  # adapters share their model's pods

    # A target whose adapter the model does not list never becomes ready: the canary waits, no traffic moves.
    kube.patch_feature(namespace, feature, {"spec": {"model": "base:sql-v3"}})
    waiting = wait_until(
        "the canary of an unlisted adapter", lambda: (x := status(kube, namespace, feature)).get("canaryModel") and x
    )
    assert waiting["canaryModel"] == "base:sql-v3"
    assert waiting["weights"] == [{"model": "base:sql-v2", "weight": 100}]


def test_a_failing_canary_is_rolled_back_and_stays_back(
    kube: Kube, operator: OperatorProcess, gateway_metrics: GatewayMetrics, namespace: str
) -> None:
    feature = f"chat-{namespace}"
    models(kube, namespace, "good", "bad")
    for model in ("good", "bad"):
        gateway_metrics.declare(feature, model, namespace=namespace)
    kube.create_feature(namespace, feature, {"model": "good", "rollout": FAST_ROLLOUT})
    wait_until("good stable", lambda: status(kube, namespace, feature).get("stableModel") == "good")
    kube.patch_feature(namespace, feature, {"spec": {"model": "bad"}})

    def rolled_back() -> bool:
        traffic(gateway_metrics, namespace, feature, "good", "bad", canary_errors=True)
        return status(kube, namespace, feature).get("phase") == "RolledBack"

    wait_until("rollback", rolled_back, timeout=60, interval=0.3)
    s = status(kube, namespace, feature)
    assert s["weights"] == [{"model": "good", "weight": 100}]
    assert s["rolledBackModel"] == "bad"
    degraded = next(c for c in s["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert "maxErrorRate" in degraded["message"]
    events = kube.core.list_namespaced_event(namespace).items
    assert any(e.type == "Warning" and e.involved_object.name == feature for e in events)
    # More analyses later, it is still on the stable model: a rollback sticks until spec changes.
    generation = kube.get_feature(namespace, feature)["metadata"]["generation"]
    analyses_before = len(s.get("analyses", []))
    traffic(gateway_metrics, namespace, feature, "good", "bad", canary_errors=False)
    again = wait_until("another reconcile", lambda: (x := status(kube, namespace, feature))
                       .get("observedGeneration") == generation and x)  # fmt: skip
    assert again["phase"] == "RolledBack"
    assert again["weights"] == [{"model": "good", "weight": 100}]
    assert len(again.get("analyses", [])) >= analyses_before


def test_fixed_gpu_budget_carves_the_canary_out_of_the_stable(
    kube: Kube, operator: OperatorProcess, gateway_metrics: GatewayMetrics, namespace: str
) -> None:
    feature = f"chat-{namespace}"
    gpu = {**CPU_MODEL, "engine": "vllm", "resources": {"gpus": 1}, "replicas": 4}
    models(kube, namespace, "old", "new", spec=gpu)
    rollout = {"steps": [25, 100], "interval": "30s", "fixedGpuBudget": True, "minStableReplicas": 1,
               "analysis": {"minRequests": 5}}  # fmt: skip
    kube.create_feature(namespace, feature, {"model": "old", "rollout": rollout})
    wait_until("old stable", lambda: status(kube, namespace, feature).get("stableModel") == "old")
    kube.patch_feature(namespace, feature, {"spec": {"model": "new"}})

    def replicas() -> tuple[int | None, int | None]:
        read = kube.apps.read_namespaced_deployment
        return read("model-old", namespace).spec.replicas, read("model-new", namespace).spec.replicas

    # At 25 % of a budget of 4: the canary gets 1 replica and the stable keeps 3 — still 4 GPUs in all.
    wait_until("budget 3 + 1", lambda: replicas() == (3, 1), timeout=30)
    overrides = status(kube, namespace, feature)["replicaOverrides"]
    assert overrides == [{"model": "new", "replicas": 1}, {"model": "old", "replicas": 3}]
    # The AIModels' own specs are untouched: the operator writes only status and its children.
    assert kube.get_model(namespace, "old")["spec"]["replicas"] == 4


def test_a_promoted_canary_hands_its_replicas_back_to_its_autoscaler_without_dropping_any(
    kube: Kube, operator: OperatorProcess, gateway_metrics: GatewayMetrics, namespace: str
) -> None:
    """Releasing a fixed-GPU-budget pin hands the model's replicas back to the operator's autoscaler, which
    continues from the count the rollout left (status.autoscaler): the Deployment never dips below the
    model's minimum (pods killed, weights reloaded) on the way."""
    feature = f"chat-{namespace}"
    minimum = 2
    autoscaled = {**CPU_MODEL, "autoscaling": {"minReplicas": minimum, "maxReplicas": 4}}
    models(kube, namespace, "old", "new", spec=autoscaled)
    for model in ("old", "new"):
        gateway_metrics.declare(feature, model, namespace=namespace)
    read = kube.apps.read_namespaced_deployment
    # The autoscaler (no metrics here) holds each model at its minimum before anything is pinned.
    wait_until("new at its minimum", lambda: read("model-new", namespace).spec.replicas == minimum, timeout=60)

    at_start = read("model-new", namespace)
    assert at_start.spec.replicas == minimum
    history: list[int] = [minimum]  # then every change the watch sees
    start_version = _version(at_start)
    last_seen = {"version": start_version}
    stop = threading.Event()

    def watch_replicas() -> None:
        # Short watches resumed from the last version seen, so the thread ends soon after `stop`.
        version = start_version
        while not stop.is_set():
            stream = watch.Watch().stream(
                kube.apps.list_namespaced_deployment, namespace, field_selector="metadata.name=model-new",
                resource_version=version, timeout_seconds=2,
            )  # fmt: skip
            for event in stream:
                replicas = event["object"].spec.replicas
                if not history or history[-1] != replicas:
                    history.append(replicas)
                version = last_seen["version"] = _version(event["object"])

    watcher_thread = threading.Thread(target=watch_replicas, daemon=True)
    watcher_thread.start()
    rollout = {**FAST_ROLLOUT, "fixedGpuBudget": True, "minStableReplicas": 1}
    kube.create_feature(namespace, feature, {"model": "old", "rollout": rollout})
    wait_until("old stable", lambda: status(kube, namespace, feature).get("stableModel") == "old")
    kube.patch_feature(namespace, feature, {"spec": {"model": "new"}})

    def promoted() -> bool:
        traffic(gateway_metrics, namespace, feature, "old", "new", canary_errors=False)
        s = status(kube, namespace, feature)
        return s.get("phase") == "Stable" and s.get("stableModel") == "new"

    wait_until("new promoted", promoted, timeout=60, interval=0.3)
    # Released: no pin for `new` in the feature's status, and its autoscaler decides again.
    assert all(o["model"] != "new" for o in status(kube, namespace, feature).get("replicaOverrides") or [])

    def autoscaler_back() -> bool:
        autoscaler = kube.get_model(namespace, "new").get("status", {}).get("autoscaler") or {}
        return autoscaler.get("reason") not in (None, "FixedGpuBudget")

    wait_until("new's autoscaler back", autoscaler_back, timeout=30)
    assert not kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items
    wait_until("the watch caught up", lambda: last_seen["version"] == _version(read("model-new", namespace)), 30)
    stop.set()
    watcher_thread.join(timeout=30)
    # Pinned to 1 at 50 %, to the whole budget at 100 %, then kept when the HPA took over: never 1 again.
    assert 1 in history, f"the canary was never carved out of the budget: {history}"
    after_carve = history[history.index(1) + 1 :]
    assert after_carve, f"the canary was never given the whole budget: {history}"
    assert min(after_carve) >= minimum, f"replicas dropped when the autoscaler took over: {history}"


def _version(obj: Any) -> str:
    return str(obj.metadata.resource_version)
