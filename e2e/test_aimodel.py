"""AIModel against a real API server: schema/CEL validation, children, status, GC, drift, restarts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.cluster_harness import (
    E2E_GATEWAY_NAMESPACE,
    GROUP,
    ROOT,
    VERSION,
    Kube,
    OperatorProcess,
    pod_spec,
    present,
    wait_until,
)

pytestmark = pytest.mark.e2e

GPU_MODEL: dict[str, Any] = {
    "source": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"},
    "engine": "vllm",
    "resources": {"gpus": 2, "cpu": "4", "memory": "16Gi"},
    "autoscaling": {"minReplicas": 1, "maxReplicas": 3},
}


# The chart's gateway pod labels, by which the operator's NetworkPolicy admits the gateway to the model pods.
GATEWAY_POD_LABELS = {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/part-of": "servlane"}


def networking(kube: Kube) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(kube.api)


def ready(kube: Kube, ns: str, name: str) -> bool:
    model = kube.get_model(ns, name)
    status = model.get("status") or {}
    return status.get("phase") == "Ready" and status.get("observedGeneration") == model["metadata"]["generation"]


def test_model_becomes_deployment_service_on_gpu_nodes_and_ready(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.create_model(namespace, "qwen", GPU_MODEL)
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "qwen"), timeout=60)

    dep = kube.apps.read_namespaced_deployment("model-qwen", namespace)
    assert dep.metadata is not None
    assert dep.metadata.owner_references is not None
    (owner,) = dep.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("AIModel", "qwen", True)
    resources = pod_spec(dep).containers[0].resources
    assert resources is not None
    assert resources.limits is not None
    assert resources.limits["nvidia.com/gpu"] == "2"
    svc = kube.core.read_namespaced_service("model-qwen", namespace)
    assert svc.spec is not None
    assert svc.spec.ports is not None
    assert svc.spec.ports[0].port == 8000
    # One writer: the operator's autoscaler sets the Deployment's replicas (at minReplicas here, no load),
    # and no HPA is made to fight it.
    assert present(dep.spec, "deployment spec").replicas == 1
    assert not kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items
    policy = networking(kube).read_namespaced_network_policy("model-qwen", namespace)
    assert policy.metadata is not None
    assert policy.metadata.owner_references is not None
    (policy_owner,) = policy.metadata.owner_references
    assert (policy_owner.kind, policy_owner.name, policy_owner.controller) == ("AIModel", "qwen", True)
    assert policy.spec is not None
    # It selects exactly the model's pods (the Deployment's selector) ...
    dep_selector = present(dep.spec, "deployment spec").selector
    policy_selector = present(policy.spec.pod_selector, "network policy podSelector")
    assert policy_selector.match_labels == dep_selector.match_labels == {"servlane.dev/model": "qwen"}
    assert policy.spec.policy_types == ["Ingress"]
    # ... and admits only the gateway pods of the gateway's namespace, only on the serving port (the e2e
    # operator is given no metrics scraper, so nothing else).
    assert policy.spec.ingress is not None
    (rule,) = policy.spec.ingress
    assert rule.ports is not None
    assert [(p.port, p.protocol) for p in rule.ports] == [("http", "TCP")]
    assert rule._from is not None
    (peer,) = rule._from
    assert peer.pod_selector is not None
    assert peer.pod_selector.match_labels == GATEWAY_POD_LABELS
    assert peer.ip_block is None
    assert peer.namespace_selector is not None
    assert peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": E2E_GATEWAY_NAMESPACE}
    assert not peer.namespace_selector.match_expressions
    container_ports = {p.name: p.container_port for p in pod_spec(dep).containers[0].ports or []}
    assert container_ports["http"] == 8000  # the named port the policy admits is the one the Service targets

    pods = kube.core.list_namespaced_pod(namespace, label_selector="servlane.dev/model=qwen").items
    assert pods
    node_names = [p.spec.node_name if p.spec is not None else None for p in pods]
    assert all(node and node.startswith("gpu-node-") for node in node_names), node_names

    status = kube.get_model(namespace, "qwen")["status"]
    assert status["readyReplicas"] == 1
    assert status["endpoint"] == f"http://model-qwen.{namespace}.svc.cluster.local:8000/v1"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "False"


def test_more_gpus_than_any_node_has_is_reported_as_insufficient_gpu(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.create_model(namespace, "huge", {**GPU_MODEL, "resources": {"gpus": 16, "cpu": "4"}})

    def insufficient() -> dict[str, Any] | None:
        cond = kube.condition(namespace, "huge", "Degraded")
        return cond if cond and cond["reason"] == "InsufficientGPU" else None

    cond = wait_until("InsufficientGPU condition", insufficient, timeout=60)
    assert cond["status"] == "True"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert kube.phase(namespace, "huge") == "Degraded"
    assert kube.condition(namespace, "huge", "Ready")["status"] == "False"  # type: ignore[index]

    def warning_event() -> bool:
        events = kube.core.list_namespaced_event(namespace).items
        return any(e.reason == "InsufficientGPU" and e.involved_object.name == "huge" for e in events)

    wait_until("an InsufficientGPU event", warning_event, timeout=30)


def test_deleting_the_model_removes_its_children(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    kube.create_model(namespace, "gone", GPU_MODEL)
    wait_until("children exist", lambda: kube.apps.read_namespaced_deployment("model-gone", namespace), timeout=60)
    wait_until(
        "network policy exists", lambda: networking(kube).read_namespaced_network_policy("model-gone", namespace)
    )
    kube.delete_model(namespace, "gone")

    def children_gone() -> bool:
        deps = kube.apps.list_namespaced_deployment(namespace).items
        svcs = kube.core.list_namespaced_service(namespace).items
        hpas = kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items
        policies = networking(kube).list_namespaced_network_policy(namespace).items
        return not deps and not svcs and not hpas and not policies

    wait_until("garbage collection of children", children_gone, timeout=60)


def test_a_hand_edit_of_an_owned_field_is_put_back(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    kube.create_model(namespace, "drift", {**GPU_MODEL, "autoscaling": None, "replicas": 2})
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "drift"), timeout=60)
    patch = {"spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "runtime", "image": "evil:1"}]}}}}
    kube.apps.patch_namespaced_deployment("model-drift", namespace, patch)

    def restored() -> bool:
        dep = kube.apps.read_namespaced_deployment("model-drift", namespace)
        return bool(dep.spec.replicas == 2 and pod_spec(dep).containers[0].image == "servlane/runtime:e2e-cuda")

    wait_until("the resync to restore replicas and image", restored, timeout=30)


def test_turning_autoscaling_off_hands_the_replicas_to_the_spec(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.create_model(namespace, "scale", GPU_MODEL)
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "scale"), timeout=60)
    kube.patch_model(namespace, "scale", {"spec": {"autoscaling": None, "replicas": 3}})
    wait_until(
        "replicas fixed at 3",
        lambda: kube.apps.read_namespaced_deployment("model-scale", namespace).spec.replicas == 3,
        timeout=30,
    )
    wait_until(
        "Ready at 3/3",
        lambda: ready(kube, namespace, "scale") and kube.get_model(namespace, "scale")["status"]["readyReplicas"] == 3,
        timeout=60,
    )


def phases_until(kube: Kube, namespace: str, name: str, since: str, done: Any, timeout: float = 60) -> list[str]:
    """Every phase the AIModel's status took from resourceVersion `since` until `done(model)` (a watch: no
    write is missed between two looks)."""
    phases: list[str] = []
    version = since
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stream = watch.Watch().stream(
            kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "aimodels",
            field_selector=f"metadata.name={name}", resource_version=version, timeout_seconds=2,
        )  # fmt: skip
        for event in stream:
            model = event["object"]
            version = model["metadata"]["resourceVersion"]
            phase = (model.get("status") or {}).get("phase", "")
            if not phases or phases[-1] != phase:
                phases.append(phase)
            if done(model):
                return phases
    raise AssertionError(f"{name}: not done within {timeout}s; phases seen: {phases}")


def test_a_ready_model_stays_ready_through_changes_that_roll_no_pod(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    # A scale-down gives the Deployment a new generation but no new template: no pod is replaced, so the model
    # never stops being Ready. Before 2026-12-06 the status said Deploying until the Deployment controller
    # had seen the generation, and a resync that switched the Deployment's strategy did the same to every
    # Ready model: an Argo CD Application went Healthy while its models read Deploying.
    kube.create_model(namespace, "steady", {**GPU_MODEL, "autoscaling": None, "replicas": 3})
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "steady"), timeout=60)
    patched = kube.patch_model(namespace, "steady", {"spec": {"replicas": 2}})

    def settled(model: dict[str, Any]) -> bool:
        status = model.get("status") or {}
        return status.get("observedGeneration") == patched["metadata"]["generation"] and (
            status.get("readyReplicas"),
            status.get("desiredReplicas"),
        ) == (2, 2)

    phases = phases_until(kube, namespace, "steady", patched["metadata"]["resourceVersion"], settled)
    assert phases == ["Ready"], phases
    # A change of template is a rollout, and says so.
    patched = kube.patch_model(namespace, "steady", {"spec": {"engineOptions": {"maxModelLen": 2048}}})

    def rolled(model: dict[str, Any]) -> bool:
        status = model.get("status") or {}
        generation = patched["metadata"]["generation"]
        return status.get("observedGeneration") == generation and status.get("phase") == "Ready"

    phases = phases_until(kube, namespace, "steady", patched["metadata"]["resourceVersion"], rolled)
    assert "Deploying" in phases, phases
    assert phases[-1] == "Ready", phases


def test_operator_killed_mid_reconcile_converges_after_restart(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    names = [f"m{i}" for i in range(8)]
    for name in names:
        kube.create_model(namespace, name, {**GPU_MODEL, "resources": {"gpus": 0, "cpu": "1"}})
    operator.kill()  # while the creations are being reconciled
    for name in names[:4]:
        kube.patch_model(namespace, name, {"spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 2}}})
    operator.start()
    for name in names:
        wait_until(f"{name} Ready after restart", partial(ready, kube, namespace, name), timeout=90)
    for name in names:
        replicas = kube.apps.read_namespaced_deployment(f"model-{name}", namespace).spec.replicas
        assert replicas == (2 if name in names[:4] else 1), name


@pytest.mark.parametrize(
    ("spec", "messages"),
    [
        ({"source": {"uri": "ftp://host/model"}}, ["source.uri must be hf://org/name[@revision]"]),
        (
            {"source": {"uri": "/m"}, "replicas": 2, "autoscaling": {"maxReplicas": 3}, "resources": {"cpu": "1"}},
            ["set either replicas or autoscaling, not both"],
        ),
        (
            {"source": {"uri": "/m"}, "autoscaling": {"minReplicas": 4, "maxReplicas": 2}, "resources": {"cpu": "1"}},
            ["autoscaling.minReplicas must not exceed autoscaling.maxReplicas"],
        ),
        (
            {"source": {"uri": "/m"}, "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfter": "0s"}},
            ["autoscaling.scaleToZeroAfter must be at least 1s"],
        ),
        (
            {"source": {"uri": "/m"}, "cache": {"persistentVolumeClaim": "c", "emptyDirSizeLimit": "1Gi"}},
            ["cache needs exactly one of persistentVolumeClaim or emptyDirSizeLimit"],
        ),
        (
            {"source": {"uri": "/m", "credentialsSecret": "tok"}},
            ["credentialsSecret applies only to hf://, s3:// and oci://"],
        ),
        (
            {"source": {"uri": "/m"}, "engine": "transformers", "engineOptions": {"gpuMemoryUtilization": 0.5}},
            ["gpuMemoryUtilization applies to the vllm engine only"],
        ),
        ({"source": {"uri": "/m"}, "engine": "tgi"}, ['Unsupported value: "tgi"']),
        ({"source": {"uri": "/m"}, "resources": {"gpus": -1}}, ["should be greater than or equal to 0"]),
        ({"engine": "vllm"}, ["spec.source: Required value"]),
        # What the Deployment's API would refuse, refused with the AIModel instead (ChildRejected otherwise).
        (
            {"source": {"uri": "/m"}, "scheduling": {"priorityClassName": "Not_A_Name!"}},
            ["spec.scheduling.priorityClassName: Invalid value"],
        ),
        (
            {"source": {"uri": "/m"}, "scheduling": {"nodeSelector": {"pool": "not a value"}}},
            ["spec.scheduling.nodeSelector.pool: Invalid value"],
        ),
        (
            {"source": {"uri": "/m"}, "scheduling": {"tolerations": [{"key": "bad key"}]}},
            ["spec.scheduling.tolerations[0].key: Invalid value"],
        ),
    ],
)
def test_invalid_manifests_are_rejected_with_clear_messages(
    kube: Kube, namespace: str, spec: dict[str, Any], messages: list[str]
) -> None:
    with pytest.raises(ApiException) as info:
        kube.create_model(namespace, "bad", spec)
    assert info.value.status == 422
    assert info.value.body is not None
    reported = json.loads(info.value.body)["message"]
    for message in messages:
        assert message in reported


def test_examples_apply_cleanly_and_become_ready(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    names = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for obj in kube.apply_file(path, namespace):
            if obj["kind"] == "AIModel":
                names.append(obj["metadata"]["name"])
    assert len(names) >= 3
    for name in names:
        wait_until(f"example {name} Ready", partial(ready, kube, namespace, name), timeout=90)


def test_kubectl_shows_the_printer_columns(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    from localcluster.cluster import binary_paths

    kube.create_model(namespace, "cols", GPU_MODEL)
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "cols"), timeout=60)
    kubectl = str(binary_paths()["kubectl"])
    out = subprocess.run(
        [kubectl, f"--kubeconfig={kube.kubeconfig}", "get", "aim", "-n", namespace],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "ENGINE", "GPUS", "READY", "DESIRED", "PHASE", "AGE"]
    assert row.split()[:6] == ["cols", "vllm", "2", "1", "1", "Ready"]


def test_operator_reports_its_own_metrics(kube: Kube, operator: OperatorProcess, namespace: str) -> None:
    kube.create_model(namespace, "metered", GPU_MODEL)
    wait_until("AIModel Ready", lambda: ready(kube, namespace, "metered"), timeout=60)
    text = operator.metrics()
    assert 'servlane_operator_reconciles_total{kind="AIModel",result="ok",trigger="change"}' in text
    assert "servlane_operator_reconcile_duration_seconds_bucket" in text


class DeploymentPolicy:
    """A cluster's own policy (a ValidatingAdmissionPolicy, as Kyverno or Gatekeeper would be) that refuses
    Deployments with an affinity, in one namespace only."""

    MESSAGE = "pod affinity is not allowed in this namespace"

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.name = f"no-affinity-{namespace}"
        self.admission = client.AdmissionregistrationV1Api(kube.api)
        self.installed = False

    def install(self, reason: str | None) -> None:
        """Refuses with `reason` (None: the API's default, Invalid, a 422; Forbidden: a 403), enforced on return."""
        rule = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"]}
        validation: dict[str, Any] = {"expression": "!has(object.spec.template.spec.affinity)", "message": self.MESSAGE}
        if reason:
            validation["reason"] = reason
        policy = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": self.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{**rule, "resources": ["deployments"]}]},
                "validations": [validation],
            },
        }
        only_here = {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}}
        binding = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": self.name},
            "spec": {
                "policyName": self.name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": only_here},
            },
        }
        self.installed = True
        self.admission.create_validating_admission_policy(cast(Any, policy))  # the client sends dicts as they are
        self.admission.create_validating_admission_policy_binding(cast(Any, binding))
        wait_until("the policy enforced", self._refuses_a_deployment, timeout=60)

    def _refuses_a_deployment(self) -> bool:
        labels = {"app": "probe"}
        pod = {"containers": [{"name": "c", "image": "busybox"}], "affinity": {"podAffinity": {}}}
        probe = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "probe"},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": pod}},
        }
        try:
            self.kube.apps.create_namespaced_deployment(self.namespace, cast(Any, probe), dry_run="All")
        except ApiException as exc:
            return self.MESSAGE in (exc.body or "")
        return False

    def remove(self) -> None:
        if self.installed:
            self.installed = False
            try:
                self.admission.delete_validating_admission_policy_binding(self.name)
            finally:
                self.admission.delete_validating_admission_policy(self.name)


@pytest.fixture
def deployment_policy(kube: Kube, namespace: str) -> Iterator[DeploymentPolicy]:
    policy = DeploymentPolicy(kube, namespace)
    yield policy
    policy.remove()


def rejection(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    cond = kube.condition(namespace, name, "Degraded")
    return cond if cond and cond["reason"] == "ChildRejected" else None


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]
        }
    }
}
CPU_MODEL = {"source": {"uri": "hf://org/tiny"}, "engine": "transformers", "resources": {"gpus": 0, "cpu": "1"}}


def test_a_spec_the_api_server_refuses_a_child_of_is_reported_in_status_until_fixed(
    kube: Kube, operator: OperatorProcess, namespace: str, deployment_policy: DeploymentPolicy
) -> None:
    """A spec the CRD accepts and the API server refuses a child of as invalid (here a cluster's policy on
    Deployments): it was a PermanentError in the operator's log, with no status at all (kubectl, Argo CD:
    nothing)."""
    deployment_policy.install(reason=None)
    kube.create_model(namespace, "refused", {**CPU_MODEL, "scheduling": {"affinity": AFFINITY}})
    cond = wait_until("the refusal in status", lambda: rejection(kube, namespace, "refused"), timeout=60)
    assert cond["status"] == "True"
    assert "The API server refused an object made from this spec" in cond["message"]
    assert DeploymentPolicy.MESSAGE in cond["message"], cond["message"]
    model = kube.get_model(namespace, "refused")
    assert model["status"]["phase"] == "Failed"  # nothing ran before: nothing serves
    assert model["status"]["observedGeneration"] == model["metadata"]["generation"]
    assert kube.condition(namespace, "refused", "Ready")["status"] == "False"  # type: ignore[index]
    # Fixed: applied, and the refusal leaves status.
    kube.patch_model(namespace, "refused", {"spec": {"scheduling": {"affinity": None}}})
    wait_until("the refusal to clear", lambda: rejection(kube, namespace, "refused") is None, timeout=60)
    wait_until("the Deployment", lambda: kube.apps.read_namespaced_deployment("model-refused", namespace), timeout=60)


def test_a_forbidden_child_is_reported_and_applied_once_the_cluster_allows_it(
    kube: Kube, operator: OperatorProcess, namespace: str, deployment_policy: DeploymentPolicy
) -> None:
    """A 403 (a policy or webhook that says Forbidden, a quota, our own RBAC) was retried every 5 s with nothing
    in status; now status says it, and it is tried again, so lifting the policy is enough: no spec change."""
    deployment_policy.install(reason="Forbidden")
    kube.create_model(namespace, "forbidden", {**CPU_MODEL, "scheduling": {"affinity": AFFINITY}})
    cond = wait_until("the refusal in status", lambda: rejection(kube, namespace, "forbidden"), timeout=60)
    assert DeploymentPolicy.MESSAGE in cond["message"], cond["message"]
    assert kube.get_model(namespace, "forbidden")["status"]["phase"] == "Failed"
    generation = kube.get_model(namespace, "forbidden")["metadata"]["generation"]
    deployment_policy.remove()
    wait_until("the refusal to clear", lambda: rejection(kube, namespace, "forbidden") is None, timeout=90)
    deployment = kube.apps.read_namespaced_deployment("model-forbidden", namespace)
    pod = present(deployment.spec.template.spec, "the Deployment's pod spec")
    assert pod.affinity is not None  # the spec as written, unchanged
    assert kube.get_model(namespace, "forbidden")["metadata"]["generation"] == generation
