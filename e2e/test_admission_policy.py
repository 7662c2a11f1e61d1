"""The chart's ValidatingAdmissionPolicy for AIModels on the real API server: rendered by helm with an admin's
values, created as the chart would create it, then AIModels written against it. The API server itself type-
checks the CEL against the AIModel CRD and refuses what the values forbid, with the policy's messages.

The binding selects only this test's namespace, so the policy never touches other tests' AIModels.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.cluster_harness import GROUP, PLURALS, VERSION, Kube, present, wait_until
from tests.support.helmtool import CHART, Helm, HelmUnavailable, find_helm

pytestmark = pytest.mark.e2e

ALLOWED_REGISTRY = "registry.example.com/ml/"
BASE: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "1"}}


def render_policy(helm: Helm, release: str, namespace: str, values_file: Path) -> list[dict[str, Any]]:
    values = {
        "admissionPolicy": {
            "enabled": True,
            "allowedImagePrefixes": [ALLOWED_REGISTRY],
            "allowedPriorityClasses": ["ml-batch"],
            "allowSecretEnv": False,
            "allowedTolerationKeys": ["nvidia.com/gpu"],
            "allowedNodeSelectorKeys": ["node.example.com/pool"],
            "allowAffinity": False,
            "allowedExtraArgs": ["--enable-prefix-caching", "--max-num-seqs"],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }
    }
    values_file.write_text(json.dumps(values))
    result = helm.run(
        "template", release, str(CHART), "--namespace", f"{release}-system",
        "--show-only", "templates/admission-policy.yaml", "--values", str(values_file),
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture
def install_policy(kube: Kube, crds: Kube, namespace: str, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Installs the policy and its binding, for `namespace` only, when called (returns the policy's name);
    both are removed afterwards."""
    try:
        helm = Helm(find_helm())
    except HelmUnavailable as exc:
        pytest.fail(f"helm is built with the control plane, so it must be there: {exc}")
    policy, binding = render_policy(helm, f"ap{uuid.uuid4().hex[:6]}", namespace, tmp_path / "values.json")
    assert (policy["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    admission = client.AdmissionregistrationV1Api(kube.api)
    installed: list[bool] = []

    def install() -> str:
        admission.create_validating_admission_policy(cast(Any, policy))  # the client sends dicts as they are
        installed.append(True)
        admission.create_validating_admission_policy_binding(cast(Any, binding))
        return str(policy["metadata"]["name"])

    yield install
    if installed:
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        admission.delete_validating_admission_policy(policy["metadata"]["name"])


def create(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> str | None:
    """Creates the AIModel (for real, so an update can follow); the API server's refusal (403) message, or None."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AIModel", "metadata": {"name": name}, "spec": spec}
    try:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS["AIModel"], body)
    except ApiException as exc:
        if exc.status != 403:  # the policy's refusal (reason Forbidden); anything else is a failure here
            raise
        return str(json.loads(exc.body or "{}")["message"])
    return None


def test_the_api_server_refuses_what_the_admin_forbids_with_the_policys_messages(
    kube: Kube, namespace: str, install_policy: Callable[[], str]
) -> None:
    # Written before the policy, as an AIModel of before an upgrade would be: still managed afterwards.
    assert create(kube, namespace, "legacy", {**BASE, "image": "docker.io/someone/runtime:1"}) is None
    guarded = install_policy()
    admission = client.AdmissionregistrationV1Api(kube.api)

    def type_checked() -> bool:
        status = admission.read_validating_admission_policy(guarded).status
        return status is not None and status.type_checking is not None

    wait_until("the policy's CEL type-checked against the AIModel CRD", type_checked, timeout=60)
    status = present(admission.read_validating_admission_policy(guarded).status, "the policy's status")
    checked = present(status.type_checking, "the policy's type checking")
    assert not checked.expression_warnings, checked.expression_warnings  # every field path exists in the CRD

    # The API server starts enforcing a new policy within a moment: the first forbidden image is the probe.
    outside = {**BASE, "image": "docker.io/attacker/miner:1"}
    refused = wait_until(
        "the policy enforced", lambda: create(kube, namespace, f"probe-{uuid.uuid4().hex[:6]}", outside), timeout=60
    )
    assert "spec.image docker.io/attacker/miner:1 is not allowed in this cluster" in refused
    assert ALLOWED_REGISTRY in refused
    assert "ghcr.io/servlane/runtime:" in refused

    forbidden = {
        "a lookalike of an allowed prefix": (
            {**BASE, "image": "registry.example.com/ml-evil/x:1"},
            "spec.image registry.example.com/ml-evil/x:1 is not allowed",
        ),
        "env from a Secret": (
            {**BASE, "env": [{"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]},
            "spec.env must not read Secrets (valueFrom.secretKeyRef) in this cluster: STOLEN do",
        ),
        "a priority class not allowed": (
            {**BASE, "scheduling": {"priorityClassName": "system-node-critical"}},
            "spec.scheduling.priorityClassName system-node-critical is not allowed in this cluster: allowed: ml-batch",
        ),
        "a toleration of every taint": (
            {**BASE, "scheduling": {"tolerations": [{"operator": "Exists"}]}},
            "spec.scheduling.tolerations may tolerate only the taint keys nvidia.com/gpu",
        ),
        "a toleration of the control plane": (
            {**BASE, "scheduling": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]}},
            "spec.scheduling.tolerations may tolerate only the taint keys nvidia.com/gpu",
        ),
        "a node selector key not allowed": (
            {**BASE, "scheduling": {"nodeSelector": {"kubernetes.io/hostname": "control-plane-1"}}},
            "spec.scheduling.nodeSelector may use only the keys node.example.com/pool",
        ),
        "affinity": (
            {**BASE, "scheduling": {"affinity": {"nodeAffinity": {}}}},
            "spec.scheduling.affinity is not allowed in this cluster",
        ),
        "a GPU resource named like a taint not allowed": (
            {**BASE, "resources": {"cpu": "1", "gpus": 1, "gpuResourceName": "team-a.example.com/reserved-gpu"}},
            "spec.resources.gpuResourceName team-a.example.com/reserved-gpu is not allowed in this cluster",
        ),
        "an engine flag not allowed": (
            {**BASE, "engine": "vllm", "engineOptions": {"extraArgs": ["--max-num-seqs", "8", "--trust-remote-code"]}},
            "spec.engineOptions.extraArgs may pass only the flags --enable-prefix-caching, --max-num-seqs in this "
            "cluster, got --max-num-seqs --trust-remote-code",
        ),
        "a flag passed with its value as one argument": (
            {**BASE, "engine": "vllm", "engineOptions": {"extraArgs": ["--worker-extension-cls=evil.X"]}},
            "got --worker-extension-cls=evil.X",
        ),
    }
    for what, (spec, message) in forbidden.items():
        refused_now = create(kube, namespace, f"bad-{uuid.uuid4().hex[:6]}", spec)
        assert refused_now is not None, f"{what} was admitted"
        assert message in refused_now, (what, refused_now)

    allowed = {
        **BASE,
        "image": f"{ALLOWED_REGISTRY}runtime:2",
        "env": [
            {"name": "PLAIN", "value": "1"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "scheduling": {
            "priorityClassName": "ml-batch",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"node.example.com/pool": "gpu"},
        },
    }
    assert create(kube, namespace, "allowed", allowed) is None
    assert create(kube, namespace, "plain", BASE) is None  # no image: the chart's runtime image
    tuned = {"extraArgs": ["--enable-prefix-caching", "--max-num-seqs=8", "--max-num-seqs", "16"]}
    assert create(kube, namespace, "tuned", {**BASE, "engine": "vllm", "engineOptions": tuned}) is None
    gpu = {**BASE, "resources": {"cpu": "1", "gpus": 1}}  # the default GPU resource, an allowed toleration key
    assert create(kube, namespace, "gpu", gpu) is None
    assert create(kube, namespace, "runtime", {**BASE, "image": "ghcr.io/servlane/runtime:0.2.0-cpu"}) is None

    # Editing the spec is judged like a create ...
    with pytest.raises(ApiException) as edit:
        kube.patch_model(namespace, "allowed", {"spec": {"image": "docker.io/attacker/miner:1"}})
    assert "spec.image docker.io/attacker/miner:1 is not allowed" in str(edit.value.body)
    with pytest.raises(ApiException) as legacy_edit:
        kube.patch_model(namespace, "legacy", {"spec": {"replicas": 2}})
    assert "spec.image docker.io/someone/runtime:1 is not allowed" in str(legacy_edit.value.body)
    # ... while a write that leaves the spec alone (the operator's finalizers, a label) is not judged, even
    # on an AIModel admitted before the policy.
    labelled = kube.patch_model(namespace, "legacy", {"metadata": {"labels": {"touched": "yes"}}})
    assert labelled["metadata"]["labels"]["touched"] == "yes"
