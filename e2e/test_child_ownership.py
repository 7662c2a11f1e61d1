"""The operator takes over nothing it does not own (issue #28.5), against a real API server.

Objects named like an AIModel's children but made by someone else (no controller reference to the
AIModel's uid) are neither applied over nor deleted; the AIModel says so in its Ready condition, and
once the name is free the operator creates its own child at the next resync.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.support.cluster_harness import Kube, OperatorProcess, wait_until

pytestmark = pytest.mark.e2e

MODEL: dict[str, Any] = {
    "source": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"},
    "engine": "vllm",
    "resources": {"gpus": 1, "cpu": "4", "memory": "16Gi"},
    "replicas": 1,
}


def ready_condition(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    conditions = (kube.get_model(namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


def test_someone_elses_service_and_hpa_are_left_alone_and_reported(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    theirs = client.V1Service(
        metadata=client.V1ObjectMeta(name="model-taken", labels={"app": "theirs"}),
        spec=client.V1ServiceSpec(selector={"app": "theirs"}, ports=[client.V1ServicePort(port=5432)]),
    )
    kube.core.create_namespaced_service(namespace, theirs)
    # The model has no autoscaling, so the operator would delete an HPA of its child's name.
    hpa = client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="model-taken"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(api_version="apps/v1", kind="Deployment", name="x"),
            max_replicas=2,
        ),
    )
    kube.autoscaling.create_namespaced_horizontal_pod_autoscaler(namespace, hpa)
    kube.create_model(namespace, "taken", MODEL)

    def conflict_reported() -> dict[str, Any] | None:
        ready = ready_condition(kube, namespace, "taken")
        return ready if ready is not None and ready["reason"] == "ChildConflict" else None

    ready = wait_until("Ready=False, ChildConflict", conflict_reported, timeout=60)
    assert ready["status"] == "False"
    assert "Service model-taken" in ready["message"]
    assert "HorizontalPodAutoscaler model-taken" in ready["message"]
    # The model's own Deployment is made all the same.
    dep = wait_until("the Deployment", lambda: kube.apps.read_namespaced_deployment("model-taken", namespace))
    assert dep.metadata is not None
    assert [ref.kind for ref in dep.metadata.owner_references or []] == ["AIModel"]
    # A hand edit of the owned Deployment, put back by a resync: that resync passed the foreign objects too.
    kube.apps.patch_namespaced_deployment("model-taken", namespace, {"spec": {"replicas": 4}})
    wait_until(
        "a resync to restore the Deployment",
        lambda: kube.apps.read_namespaced_deployment("model-taken", namespace).spec.replicas == 1,
        timeout=30,
    )
    svc = kube.core.read_namespaced_service("model-taken", namespace)
    assert svc.metadata is not None
    assert svc.metadata.owner_references is None
    assert svc.spec is not None
    assert [p.port for p in svc.spec.ports or []] == [5432]
    assert svc.spec.selector == {"app": "theirs"}
    kube.autoscaling.read_namespaced_horizontal_pod_autoscaler("model-taken", namespace)  # still there

    # Its owner removes the Service: the next resync creates the operator's own, and the conflict narrows.
    kube.core.delete_namespaced_service("model-taken", namespace)

    def own_service() -> bool:
        svc = kube.core.read_namespaced_service("model-taken", namespace)
        ports = [p.port for p in (svc.spec.ports or [])] if svc.spec else []
        return bool(svc.metadata and svc.metadata.owner_references and ports == [8000])

    wait_until("the operator's own Service", own_service, timeout=30)

    def only_the_hpa_left() -> bool:
        ready = ready_condition(kube, namespace, "taken")
        return bool(ready and "HorizontalPodAutoscaler" in ready["message"] and "Service" not in ready["message"])

    wait_until("the conflict names the HPA alone", only_the_hpa_left, timeout=30)
