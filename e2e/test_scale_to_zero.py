"""Replicas with one writer, on a real API server (KWOK nodes, no real node): `kubectl scale aimodel` through
the scale subresource, a model idle to zero with its condition, and a demand Lease that wakes it at once.

KWOK pods are Ready without serving anything, and the autoscaler never takes a ready pod it cannot read for
an idle one; so the model that goes to zero here has pods no node takes (a node selector nothing matches):
no ready pod, no request, no demand, and after scaleToZeroAfter it is at zero, which is the idle window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from servlane_api import GROUP, VERSION
from servlane_core.routing.waking import DEMAND_MANAGED_BY, demand_lease_name
from tests.support.cluster_harness import Kube, OperatorProcess, json_object, wait_until

pytestmark = pytest.mark.e2e

CPU_MODEL: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "1"}}
TO_ZERO: dict[str, Any] = {
    **CPU_MODEL,
    "scheduling": {"nodeSelector": {"servlane.dev/e2e": "no-such-node"}},
    "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfter": "3s"},
}


def deployment_replicas(kube: Kube, namespace: str, name: str) -> int | None:
    try:
        return kube.apps.read_namespaced_deployment(f"model-{name}", namespace).spec.replicas
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def scale(kube: Kube, namespace: str, name: str, replicas: int) -> None:
    kube.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, "aimodels", name, {"spec": {"replicas": replicas}}
    )


def test_kubectl_scale_sets_the_replicas_the_operator_copies_to_the_deployment(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.create_model(namespace, "fixed", {**CPU_MODEL, "replicas": 1})
    wait_until("Deployment at 1", lambda: deployment_replicas(kube, namespace, "fixed") == 1, timeout=60)
    scale(kube, namespace, "fixed", 3)
    wait_until("Deployment at 3", lambda: deployment_replicas(kube, namespace, "fixed") == 3, timeout=30)
    assert kube.get_model(namespace, "fixed")["spec"]["replicas"] == 3

    def scale_status() -> dict[str, Any] | None:
        got = kube.custom.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, "aimodels", "fixed")
        status = json_object(got, "the AIModel's scale").get("status") or {}
        return status if status.get("replicas") == 3 else None

    # What an HPA or KEDA reads: the pods the model has, and the selector of its pods.
    status = wait_until("the scale subresource reports 3 pods", scale_status, timeout=60)
    assert status["selector"] == "servlane.dev/model=fixed"


def test_an_autoscaled_model_refuses_a_second_writer(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    kube.create_model(namespace, "auto", {**CPU_MODEL, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}})
    with pytest.raises(ApiException) as refused:
        scale(kube, namespace, "auto", 3)
    assert refused.value.status == 422
    assert "set either replicas or autoscaling, not both" in str(refused.value.body)


def test_an_idle_model_goes_to_zero_and_a_demand_lease_wakes_it_at_once(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.create_model(namespace, "sleepy", TO_ZERO)
    kube.create_feature(namespace, "sleepy-chat", {"model": "sleepy"})
    # It starts with one replica (seen to load), then goes to zero after 3 s without a request.
    wait_until("Deployment at 1", lambda: deployment_replicas(kube, namespace, "sleepy") == 1, timeout=60)
    wait_until("Deployment at 0", lambda: deployment_replicas(kube, namespace, "sleepy") == 0, timeout=60)

    def scaled_to_zero() -> dict[str, Any] | None:
        condition = kube.condition(namespace, "sleepy", "ScaledToZero")
        return condition if condition is not None and condition["status"] == "True" else None

    condition = wait_until("ScaledToZero condition", scaled_to_zero, timeout=30)
    assert "the next request through the gateway wakes it" in condition["message"]
    ready = kube.condition(namespace, "sleepy", "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")
    autoscaler = kube.get_model(namespace, "sleepy")["status"]["autoscaler"]
    assert (autoscaler["desiredReplicas"], autoscaler["reason"]) == (0, "Idle")

    def feature_at_rest() -> dict[str, Any] | None:
        conditions = (kube.get_feature(namespace, "sleepy-chat").get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c["type"] == "Ready"), None)
        return ready if ready is not None and ready["reason"] == "ScaledToZero" else None

    # The feature tells a model at rest from a failing one (GitOps health shows it Healthy by this reason).
    ready = wait_until("the feature's Ready says its model rests at zero", feature_at_rest, timeout=30)
    assert ready["status"] == "False"
    assert "sleepy scaled to zero" in ready["message"]

    # A Lease of another model's name, or a stale one, wakes nothing.
    create_lease(kube, namespace, "servlane-demand-other", "sleepy", datetime.now(UTC))
    create_lease(kube, namespace, demand_lease_name("sleepy"), "sleepy", datetime.fromtimestamp(time.time() - 300, UTC))
    holds_for("the model stays at zero", lambda: deployment_replicas(kube, namespace, "sleepy") == 0, seconds=2)

    # The gateway renews its Lease as it holds a request: the operator wakes the model on the Lease's event.
    renewed = datetime.now(UTC)
    started = time.monotonic()
    coordination(kube).patch_namespaced_lease(
        demand_lease_name("sleepy"), namespace, {"spec": {"renewTime": micro_time(renewed)}}
    )
    wait_until("woken to 1", lambda: deployment_replicas(kube, namespace, "sleepy") == 1, timeout=10, interval=0.05)
    woke_in = time.monotonic() - started
    assert woke_in < 2.0, f"the demand Lease took {woke_in:.2f}s to wake the model"
    reason = kube.get_model(namespace, "sleepy")["status"]["autoscaler"]["reason"]
    assert reason in ("Demand", "NoSignals", "AtTarget")


def test_ready_pods_the_operator_cannot_read_are_not_taken_for_idle(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    """KWOK's Ready pods answer nothing on their metrics port: they may be busy, so the model stays up."""
    kube.create_model(namespace, "unread", {**TO_ZERO, "scheduling": {}})
    wait_until("Deployment at 1", lambda: deployment_replicas(kube, namespace, "unread") == 1, timeout=60)

    def holding() -> dict[str, Any] | None:
        autoscaler = (kube.get_model(namespace, "unread").get("status") or {}).get("autoscaler") or {}
        return autoscaler if autoscaler.get("reason") == "NoSignals" else None

    autoscaler = wait_until("the autoscaler holding", holding, timeout=30)
    assert "did not answer on their metrics port" in autoscaler["message"]
    holds_for("the model stays at 1", lambda: deployment_replicas(kube, namespace, "unread") == 1, seconds=6)


def test_turning_autoscaling_on_keeps_the_replicas_the_model_had(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    """The autoscaler starts from the live count (here it reads no load: KWOK pods), not from minReplicas."""
    kube.create_model(namespace, "switch", {**CPU_MODEL, "replicas": 3})
    wait_until("Deployment at 3", lambda: deployment_replicas(kube, namespace, "switch") == 3, timeout=60)
    kube.patch_model(namespace, "switch", {"spec": {"replicas": None, "autoscaling": {"maxReplicas": 4}}})

    def decided() -> dict[str, Any] | None:
        autoscaler = (kube.get_model(namespace, "switch").get("status") or {}).get("autoscaler") or {}
        return autoscaler if autoscaler.get("reason") else None

    holds_for("the Deployment keeps 3", lambda: deployment_replicas(kube, namespace, "switch") == 3, seconds=3)
    assert wait_until("the autoscaler's first decision", decided, timeout=30)["desiredReplicas"] == 3


def holds_for(what: str, check: Callable[[], bool], seconds: float) -> None:
    """`check` holds at every look for `seconds` (an absence can only be watched for a while)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), f"{what}: no longer true"
        time.sleep(0.1)


def coordination(kube: Kube) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(kube.api)


def micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def create_lease(kube: Kube, namespace: str, name: str, model: str, renewed: datetime) -> None:
    labels = {"servlane.dev/model": model, DEMAND_MANAGED_BY[0]: DEMAND_MANAGED_BY[1]}
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1LeaseSpec(holder_identity="gateway-e2e", renew_time=renewed),
    )
    coordination(kube).create_namespaced_lease(namespace, body)
