"""The gateway's Lease policy (charts/servlane/templates/gateway-lease-policy.yaml) on the real API server.

The chart's gateway ServiceAccount, its ClusterRole (Leases: get, create, patch, as RBAC cannot narrow create
by name) and the policy are rendered by helm for a release of this test's own and created as the chart would
create them. Then Leases are written with a bound token of that ServiceAccount, as a compromised gateway
would: its own demand Lease is written (by the gateway's real writer), every other Lease write (a finalizer or
owner reference added included) and any delete is refused with the policy's message. The policy judges only
that release's ServiceAccount, so it touches no other test's writes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from servlane_core.scaling.demand import demanded_model
from servlane_gateway.routing.demand_lease import KubeDemandLease
from tests.support.cluster_harness import Kube, namespace_body, present, wait_until
from tests.support.helmtool import CHART, Helm, HelmUnavailable, find_helm

pytestmark = pytest.mark.e2e

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
TEMPLATES = ("gateway-serviceaccount.yaml", "gateway-rbac.yaml", "gateway-lease-policy.yaml")
DEMAND_LABELS = {"app.kubernetes.io/managed-by": "servlane-gateway", "servlane.dev/model": "x"}
NOT_A_DEMAND_LEASE = "the gateway may write only its demand Leases, named servlane-demand-<model>: Lease "
WRONG_LABELS = "only as a demand Lease: named servlane-demand-<model>, labelled app.kubernetes.io/managed-by"
METADATA = "the gateway may not add or change finalizers or owner references of Lease "


@dataclass
class Gateway:
    """The chart's gateway ServiceAccount of one release: its Lease API as that account, and the policy."""

    leases: client.CoordinationV1Api
    user: str  # system:serviceaccount:<namespace>:<name>
    policy: str
    first_refusal: str = ""  # of a Lease that is not a demand Lease, once the policy is enforced


def render(helm: Helm, release: str, namespace: str) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--api-versions", VAP_API]
    for template in TEMPLATES:
        args += ["--show-only", f"templates/{template}"]
    return [doc for doc in yaml.safe_load_all(helm.run(*args).stdout) if doc]


def lease(name: str, labels: dict[str, str] | None = None, holder: str = "gw-0", **metadata: Any) -> Any:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, **({"labels": labels} if labels else {}), **metadata},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def owner() -> dict[str, str]:
    """An owner reference (to an object that is not there: the garbage collector would delete the Lease)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": str(uuid.uuid4())}


def refusal(write: Callable[[], object]) -> str | None:
    """Runs the write; the API server's refusal (403) message, or None when it was admitted."""
    try:
        write()
    except ApiException as exc:
        if exc.status != 403:  # the policy's refusal (reason Forbidden); anything else is a failure here
            raise
        return str(json.loads(exc.body or "{}")["message"])
    return None


@pytest.fixture
def gateway(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[Gateway]:
    try:
        helm = Helm(find_helm())
    except HelmUnavailable as exc:
        pytest.fail(f"helm is built with the control plane, so it must be there: {exc}")
    release = f"gl{uuid.uuid4().hex[:6]}"
    home = f"{release}-system"
    objects = render(helm, release, home)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ], kinds  # fmt: skip
    admission = client.AdmissionregistrationV1Api(kube.api)
    create: dict[str, Callable[[Any], object]] = {
        "ServiceAccount": lambda o: kube.core.create_namespaced_service_account(home, o),
        "ClusterRole": kube.rbac.create_cluster_role,
        "ClusterRoleBinding": kube.rbac.create_cluster_role_binding,
        "ValidatingAdmissionPolicy": admission.create_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.create_validating_admission_policy_binding,
    }
    delete: dict[str, Callable[[str], object]] = {
        "ClusterRole": kube.rbac.delete_cluster_role,
        "ClusterRoleBinding": kube.rbac.delete_cluster_role_binding,
        "ValidatingAdmissionPolicy": admission.delete_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.delete_validating_admission_policy_binding,
    }
    created: list[dict[str, Any]] = []
    kube.core.create_namespace(namespace_body(home))
    try:
        for obj in objects:
            create[obj["kind"]](cast(Any, obj))  # the client sends dicts as they are
            created.append(obj)
        service_account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
        request: Any = {"spec": {"expirationSeconds": 3600}}
        answer: Any = kube.core.create_namespaced_service_account_token(service_account, home, request)
        server, ca = kube.server_and_ca()
        kubeconfig = tmp_path / "gateway.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "gw",
                    "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
                    "users": [{"name": "gw", "user": {"token": answer.status.token}}],
                    "contexts": [{"name": "gw", "context": {"cluster": "c", "user": "gw"}}],
                }
            )
        )
        as_gateway = Kube(kubeconfig)
        policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy")["metadata"]["name"]
        identity = Gateway(
            client.CoordinationV1Api(as_gateway.api), f"system:serviceaccount:{home}:{service_account}", policy
        )
        identity.first_refusal = enforced(kube, identity, namespace)
        yield identity
    finally:
        for obj in reversed(created):
            if obj["kind"] in delete:
                delete[obj["kind"]](obj["metadata"]["name"])
        kube.core.delete_namespace(home)


def enforced(kube: Kube, gateway: Gateway, namespace: str) -> str:
    """Waits until the API server has type-checked the policy (no warnings: every field path exists on a
    Lease) and enforces it; returns its first refusal."""
    admission = client.AdmissionregistrationV1Api(kube.api)
    leases, policy = gateway.leases, gateway.policy

    def type_checked() -> bool:
        status = admission.read_validating_admission_policy(policy).status
        return status is not None and status.type_checking is not None

    wait_until("the policy's CEL type-checked against Lease", type_checked, timeout=60)
    status = present(admission.read_validating_admission_policy(policy).status, "the policy's status")
    checked = present(status.type_checking, "the policy's type checking")
    assert not checked.expression_warnings, checked.expression_warnings

    # The API server enforces a new policy within a moment: a Lease that is not a demand Lease is the probe.
    def probe_refused() -> str | None:
        message = refusal(lambda: leases.create_namespaced_lease(namespace, lease(f"p-{uuid.uuid4().hex[:6]}")))
        return message if message is not None and policy in message else None  # not RBAC's, while it loads

    return wait_until("the policy enforced", probe_refused, timeout=60)


def test_the_gateway_writes_its_demand_leases_and_no_other(kube: Kube, namespace: str, gateway: Gateway) -> None:
    probe = gateway.first_refusal
    assert NOT_A_DEMAND_LEASE in probe
    assert gateway.user in probe  # the message says whose write it refused, and which policy did
    assert gateway.policy in probe

    # Its own demand Lease: created, then renewed, by the gateway's real writer.
    writer = KubeDemandLease(gateway.leases, holder="gw-0")
    try:
        writer.signal(namespace, "x")
        wait_until("the demand Lease created", lambda: writer.writes >= 1 or None, timeout=30)
        writer.signal(namespace, "x")
        wait_until("the demand Lease renewed", lambda: writer.writes >= 2 or None, timeout=30)
    finally:
        writer.close()
    written: Any = client.CoordinationV1Api(kube.api).read_namespaced_lease("servlane-demand-x", namespace)
    assert written.metadata.labels == DEMAND_LABELS
    assert written.spec.holder_identity == "gw-0"
    # What the operator (its own ServiceAccount, which the policy does not judge) wakes on: model x.
    assert demanded_model(written.metadata.name, written.metadata.labels) == "x"

    kcm_existed = _exists(kube, "kube-system", "kube-controller-manager")
    try:
        # kube-system's leader election: taken over, the controller manager would stop (or run twice).
        kcm = refusal(
            lambda: gateway.leases.create_namespaced_lease(
                "kube-system", lease("kube-controller-manager", DEMAND_LABELS)
            )
        )
        assert kcm is not None, "the gateway created kube-system/kube-controller-manager"
        assert NOT_A_DEMAND_LEASE + "kube-system/kube-controller-manager is not one" in kcm
    finally:
        if not kcm_existed and _exists(kube, "kube-system", "kube-controller-manager"):
            client.CoordinationV1Api(kube.api).delete_namespaced_lease("kube-controller-manager", "kube-system")

    # Another controller's lock in a tenant's namespace: neither created nor taken over.
    client.CoordinationV1Api(kube.api).create_namespaced_lease(
        namespace, lease("cert-manager-controller", holder="cm-0")
    )
    refused = {
        "a Lease named like another controller's": (
            lambda: gateway.leases.create_namespaced_lease(
                namespace, lease("ingress-controller-leader", DEMAND_LABELS)
            ),
            NOT_A_DEMAND_LEASE + f"{namespace}/ingress-controller-leader is not one",
        ),
        "another controller's Lease taken over": (
            lambda: gateway.leases.patch_namespaced_lease(
                "cert-manager-controller", namespace, {"spec": {"holderIdentity": "gw-0"}}
            ),
            NOT_A_DEMAND_LEASE + f"{namespace}/cert-manager-controller is not one",
        ),
        "a demand Lease without the gateway's label": (
            lambda: gateway.leases.create_namespaced_lease(
                namespace, lease("servlane-demand-y", {"servlane.dev/model": "y"})
            ),
            WRONG_LABELS,
        ),
        "a demand Lease without the model's label": (
            lambda: gateway.leases.create_namespaced_lease(
                namespace, lease("servlane-demand-y", {"app.kubernetes.io/managed-by": "servlane-gateway"})
            ),
            WRONG_LABELS,
        ),
        "a demand Lease labelled for another model": (
            lambda: gateway.leases.create_namespaced_lease(namespace, lease("servlane-demand-y", DEMAND_LABELS)),
            WRONG_LABELS,
        ),
        "its own demand Lease relabelled for another model": (
            lambda: gateway.leases.patch_namespaced_lease(
                "servlane-demand-x", namespace, {"metadata": {"labels": {"servlane.dev/model": "y"}}}
            ),
            WRONG_LABELS,
        ),
    }
    for what, (write, message) in refused.items():
        refused_now = refusal(write)
        assert refused_now is not None, f"{what} was admitted"
        assert message in refused_now, (what, refused_now)
    cert_manager: Any = client.CoordinationV1Api(kube.api).read_namespaced_lease("cert-manager-controller", namespace)
    assert cert_manager.spec.holder_identity == "cm-0"

    # A Lease of a demand Lease's name that the gateway did not write: not labelled into one.
    client.CoordinationV1Api(kube.api).create_namespaced_lease(namespace, lease("servlane-demand-z", holder="team"))
    adopted = refusal(
        lambda: gateway.leases.patch_namespaced_lease(
            "servlane-demand-z", namespace,
            {"metadata": {"labels": {**DEMAND_LABELS, "servlane.dev/model": "z"}}, "spec": {"holderIdentity": "gw-0"}},
        )
    )  # fmt: skip
    assert adopted is not None, "the gateway adopted a Lease it did not write"
    assert f"may not change Lease {namespace}/servlane-demand-z: it does not carry the label" in adopted


def test_the_gateway_adds_no_finalizer_nor_owner_and_keeps_an_admins(
    kube: Kube, namespace: str, gateway: Gateway
) -> None:
    """A finalizer on any Lease of a namespace holds the namespace's deletion (Terminating until someone removes
    it): with a ClusterRole, a compromised gateway could hold every tenant's. It writes none, and owner
    references none; those an admin put on its demand Lease stay through its renewals."""
    admin = client.CoordinationV1Api(kube.api)
    writer = KubeDemandLease(gateway.leases, holder="gw-0")
    try:
        writer.signal(namespace, "x")
        wait_until("the demand Lease created", lambda: writer.writes >= 1 or None, timeout=30)
        labels_f = {**DEMAND_LABELS, "servlane.dev/model": "f"}
        labels_o = {**DEMAND_LABELS, "servlane.dev/model": "o"}
        refused = {
            "a demand Lease created with a finalizer": lambda: gateway.leases.create_namespaced_lease(
                namespace, lease("servlane-demand-f", labels_f, finalizers=["example.com/hold"])
            ),
            "a demand Lease created with an owner": lambda: gateway.leases.create_namespaced_lease(
                namespace, lease("servlane-demand-o", labels_o, ownerReferences=[owner()])
            ),
            "its demand Lease given a finalizer": lambda: gateway.leases.patch_namespaced_lease(
                "servlane-demand-x", namespace, {"metadata": {"finalizers": ["example.com/hold"]}}
            ),
            "its demand Lease given an owner": lambda: gateway.leases.patch_namespaced_lease(
                "servlane-demand-x", namespace, {"metadata": {"ownerReferences": [owner()]}}
            ),
        }
        for what, write in refused.items():
            refused_now = refusal(write)
            assert refused_now is not None, f"{what} was admitted"
            assert METADATA in refused_now, (what, refused_now)
        kept: Any = admin.read_namespaced_lease("servlane-demand-x", namespace)
        assert not kept.metadata.finalizers
        assert not kept.metadata.owner_references

        # An admin's finalizer on the demand Lease: the gateway's renewals keep it (and may renew).
        admin.patch_namespaced_lease("servlane-demand-x", namespace, {"metadata": {"finalizers": ["example.com/keep"]}})
        writer.signal(namespace, "x")
        wait_until("the demand Lease renewed", lambda: writer.writes >= 2 or None, timeout=30)
        renewed: Any = admin.read_namespaced_lease("servlane-demand-x", namespace)
        assert renewed.metadata.finalizers == ["example.com/keep"]
        removed = refusal(
            lambda: gateway.leases.patch_namespaced_lease(
                "servlane-demand-x", namespace, {"metadata": {"finalizers": None}}
            )
        )
        assert removed is not None, "the gateway removed an admin's finalizer"
        assert METADATA in removed, removed
    finally:
        writer.close()
        for name in ("servlane-demand-x", "servlane-demand-f"):  # nothing may hold the namespace's deletion
            with contextlib.suppress(ApiException):
                admin.patch_namespaced_lease(name, namespace, {"metadata": {"finalizers": None}})


def test_the_gateway_deletes_no_lease_even_when_rbac_lets_it(kube: Kube, namespace: str, gateway: Gateway) -> None:
    leases = client.CoordinationV1Api(kube.api)
    leases.create_namespaced_lease(namespace, lease("servlane-demand-x", DEMAND_LABELS))
    leases.create_namespaced_lease(namespace, lease("cert-manager-controller", holder="cm-0"))
    # A right to delete Leases, granted to the gateway's ServiceAccount here as an admin might by mistake.
    role: Any = {
        "metadata": {"name": "lease-deleter"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["delete"]}],
    }
    kube.rbac.create_namespaced_role(namespace, role)
    home, account = gateway.user.split(":")[2:]
    binding: Any = {
        "metadata": {"name": "lease-deleter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease-deleter"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": home}],
    }
    kube.rbac.create_namespaced_role_binding(namespace, binding)

    for name in ("cert-manager-controller", "servlane-demand-x"):
        # RBAC's refusal comes first until the binding reaches the authorizer; then the policy's.
        delete = functools.partial(gateway.leases.delete_namespaced_lease, name, namespace)
        refused = wait_until(
            f"the policy refusing the delete of {name}", functools.partial(_policy_refusal, delete), timeout=30
        )
        assert f"the gateway may not delete Lease {namespace}/{name}" in refused
        kept: Any = leases.read_namespaced_lease(name, namespace)
        assert kept.metadata.name == name  # still there


def _policy_refusal(write: Callable[[], object]) -> str | None:
    message = refusal(write)
    if message is None:
        raise AssertionError("the delete was admitted")
    return message if "ValidatingAdmissionPolicy" in message else None


def _exists(kube: Kube, namespace: str, name: str) -> bool:
    try:
        client.CoordinationV1Api(kube.api).read_namespaced_lease(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
