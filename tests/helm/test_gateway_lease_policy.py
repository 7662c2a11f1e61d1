"""The gateway's Lease policy as the chart renders it: on whenever the cluster serves ValidatingAdmissionPolicy,
absent otherwise or when turned off, bound to the gateway's own ServiceAccount, and the gateway's Lease rights
narrowed to what it does (get, create, patch). The CEL itself is run by the real API server in
e2e/test_gateway_lease_policy.py."""

from __future__ import annotations

from typing import Any

from tests.support.helmtool import CHART, Helm, find, one

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
POLICY = "mp-servlane-servlane-system-gateway-leases"


def lease_policy(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy") and "gateway" in o["metadata"]["name"]
    ]


def match_condition(policy: dict[str, Any]) -> str:
    (condition,) = policy["spec"]["matchConditions"]
    return str(condition["expression"])


def test_on_by_default_where_the_cluster_serves_validating_admission_policy(helm: Helm) -> None:
    objects = helm.template(api_versions=(VAP_API,))
    policy = one(objects, "ValidatingAdmissionPolicy", POLICY)
    binding = one(objects, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}  # every namespace
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"]
    assert rule["resources"] == ["leases"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert match_condition(policy) == (
        'request.userInfo.username == "system:serviceaccount:servlane-system:mp-servlane-gateway"'
    )
    # Independent of the optional tenant policy for AIModels, which stays off by default.
    assert not find(objects, "ValidatingAdmissionPolicy", "mp-servlane-servlane-system-aimodels")


def test_absent_where_the_cluster_does_not_serve_it_or_when_turned_off(helm: Helm) -> None:
    assert not lease_policy(helm.template())
    assert not lease_policy(helm.template(set_values=("gateway.leasePolicy.enabled=false",), api_versions=(VAP_API,)))
    assert not lease_policy(helm.template(set_values=("gateway.enabled=false",), api_versions=(VAP_API,)))


def test_it_judges_the_gateways_own_service_account_of_each_release(helm: Helm) -> None:
    named = helm.template(
        set_values=("gateway.serviceAccount.name=edge",), api_versions=(VAP_API,), release="r2", namespace="ml"
    )
    policy = one(named, "ValidatingAdmissionPolicy", "r2-servlane-ml-gateway-leases")
    assert match_condition(policy) == 'request.userInfo.username == "system:serviceaccount:ml:edge"'
    # An existing ServiceAccount (not created by the chart) is the one judged, too.
    existing = helm.template(
        set_values=("gateway.serviceAccount.create=false", "gateway.serviceAccount.name=gw"), api_versions=(VAP_API,)
    )
    assert "system:serviceaccount:servlane-system:gw" in match_condition(one(existing, "ValidatingAdmissionPolicy"))


def test_messages_name_the_gateway_and_the_policy(helm: Helm) -> None:
    policy = one(helm.template(api_versions=(VAP_API,)), "ValidatingAdmissionPolicy", POLICY)
    refusal = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["refusal"]
    assert "system:serviceaccount:servlane-system:mp-servlane-gateway" in refusal
    assert POLICY in refusal
    assert all(v["reason"] == "Forbidden" and "variables.refusal" in v["messageExpression"]
               for v in policy["spec"]["validations"])  # fmt: skip


def test_the_gateway_may_not_update_list_or_delete_leases(helm: Helm) -> None:
    for objects, kind in (
        (helm.template(), "ClusterRole"),
        (helm.template(CHART / "ci/namespaced-values.yaml"), "Role"),
    ):
        roles = find(objects, kind, "mp-servlane-gateway")
        assert roles
        for role in roles:
            lease_verbs = {verb for rule in role["rules"] if "leases" in rule["resources"] for verb in rule["verbs"]}
            assert lease_verbs == {"get", "create", "patch"}, (kind, role["metadata"].get("namespace"))
