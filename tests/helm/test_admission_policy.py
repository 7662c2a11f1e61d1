"""The chart's optional ValidatingAdmissionPolicy for AIModels (issue #28, item 6): rendered only when asked,
the admin's values reaching the CEL as data (toJson), never as code. e2e/test_admission_policy.py runs it on
the real API server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.helmtool import CHART, Helm, find, one

POLICY = "mp-servlane-servlane-system-aimodels"


def policy_and_binding(helm: Helm, *set_values: str) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = helm.template(set_values=("admissionPolicy.enabled=true", *set_values))
    return one(objects, "ValidatingAdmissionPolicy"), one(objects, "ValidatingAdmissionPolicyBinding")


def variables(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy's list variables, parsed: each is a JSON list, which is a CEL list literal."""
    return {v["name"]: json.loads(v["expression"]) for v in policy["spec"]["variables"]}


def test_off_by_default(helm: Helm) -> None:
    objects = helm.template()
    assert not find(objects, "ValidatingAdmissionPolicy")
    assert not find(objects, "ValidatingAdmissionPolicyBinding")


def test_on_it_checks_aimodel_writes_that_change_the_spec(helm: Helm) -> None:
    policy, binding = policy_and_binding(helm)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    # Cluster-scoped: the name carries the release's namespace, so two releases never share one.
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == POLICY
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["servlane.dev"],
        ["aimodels"],
        ["CREATE", "UPDATE"],
    )
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == "request.operation == 'CREATE' || object.spec != oldObject.spec"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace
    # Empty lists: only the chart's runtime repositories, no priority class, GPU tolerations, any node label.
    assert variables(policy) == {
        "imagePrefixes": [
            "ghcr.io/servlane/runtime:",
            "ghcr.io/servlane/runtime@",
        ],
        "priorityClasses": [],
        "tolerationKeys": ["nvidia.com/gpu"],
        "nodeSelectorKeys": ["*"],
        "extraArgs": [],  # no engine flag until the admin names it
    }
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert expressions[1].startswith("false || ")  # allowSecretEnv: false
    assert expressions[2].startswith("true || ")  # allowCredentialsSecret: true
    assert all("message" in v or "messageExpression" in v for v in policy["spec"]["validations"])


def test_values_reach_the_cel_as_data_never_as_code(helm: Helm) -> None:
    # A value shaped to close the list and the expression: it must stay one string of the list.
    hostile = 'evil.io/", "x") || true || ["'
    values = {
        "enabled": True,
        "allowedPriorityClasses": [hostile],
        "allowedImagePrefixes": ["registry.example.com/ml/"],
        "allowedTolerationKeys": [],
    }
    rendered = helm.run("template", "mp", str(CHART), "--set-json", f"admissionPolicy={json.dumps(values)}").stdout
    (policy,) = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "ValidatingAdmissionPolicy"]
    got = variables(policy)
    assert got["priorityClasses"] == [hostile]
    assert got["imagePrefixes"][-1] == "registry.example.com/ml/"
    assert got["tolerationKeys"] == []


def test_the_binding_takes_a_namespace_selector_and_other_actions(helm: Helm) -> None:
    _, binding = policy_and_binding(
        helm,
        "admissionPolicy.namespaceSelector.matchLabels.servlane\\.dev/tenant=search",
        "admissionPolicy.validationActions={Warn,Audit}",
    )
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"servlane.dev/tenant": "search"}}
    }
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        # A prefix that ends mid-name would let registry.example.com/ml-evil through as "registry.example.com/ml".
        ("admissionPolicy.allowedImagePrefixes[0]=registry.example.com/ml", "/admissionPolicy/allowedImagePrefixes/0"),
        ("admissionPolicy.validationActions={Deny,Warn}", "/admissionPolicy/validationActions"),
        ("admissionPolicy.validationActions={Block}", "/admissionPolicy/validationActions/0"),
        ("admissionPolicy.allowSecretEnv=yes", "/admissionPolicy/allowSecretEnv"),
        ("admissionPolicy.allowedImages[0]=x", "additional properties 'allowedImages' not allowed"),
        # A flag is matched as given: without its dashes, or with a value, it would never match what is passed.
        ("admissionPolicy.allowedExtraArgs[0]=enable-prefix-caching", "/admissionPolicy/allowedExtraArgs/0"),
        ("admissionPolicy.allowedExtraArgs[0]=--max-num-seqs=8", "/admissionPolicy/allowedExtraArgs/0"),
    ],
)
def test_the_schema_refuses_values_that_would_not_mean_what_they_say(helm: Helm, setting: str, message: str) -> None:
    result = helm.run(
        "template", "mp", str(CHART), "--set", "admissionPolicy.enabled=true", "--set", setting, check=False
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_lint_passes_with_the_policy_on(helm: Helm) -> None:
    result = helm.run("lint", str(CHART), "--strict", "--set", "admissionPolicy.enabled=true")
    assert "0 chart(s) failed" in result.stdout
