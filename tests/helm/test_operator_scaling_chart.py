"""What the chart gives the operator's autoscaler: read access to the gateway's demand Leases (and no more
than removing the HPAs an older operator made), and its namespace, so the model pods' NetworkPolicy admits
its pods to their metrics port."""

from __future__ import annotations

from tests.support.helmtool import Helm, one


def test_the_operator_reads_demand_leases_and_only_deletes_hpas(helm: Helm) -> None:
    objects = helm.template()
    role = one(objects, "ClusterRole", "mp-servlane-operator")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("coordination.k8s.io",), ("leases",))] == {"get", "list", "watch"}
    assert rules[(("autoscaling",), ("horizontalpodautoscalers",))] == {"get", "delete"}
    # The operator never writes an AIModel's spec, so it needs no aimodels/scale.
    assert not any("aimodels/scale" in resources for _, resources in rules)


def test_the_operator_knows_its_namespace_for_the_model_network_policies(helm: Helm) -> None:
    deployment = one(helm.template(namespace="ops"), "Deployment", "mp-servlane-operator")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVLANE_OPERATOR_NAMESPACE"] == "ops"


def test_the_operator_pods_wear_the_labels_the_model_network_policies_admit(helm: Helm) -> None:
    from servlane_operator.builders.network_policy import OPERATOR_LABELS

    deployment = one(helm.template(), "Deployment", "mp-servlane-operator")
    assert OPERATOR_LABELS.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
