"""Releasing replicas to an HPA: who applied spec.replicas, and the body that keeps the count meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from servlane_operator.builders import replicas_handover
from servlane_operator.labels import FIELD_MANAGER
from servlane_operator.observed import DeploymentView, replicas_appliers

HPA_SPEC_FIELDS: dict[str, Any] = {"f:spec": {"f:replicas": {}, "f:template": {}}}


def managed(manager: str, operation: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "fieldsV1": fields}


def desired(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "model-a", "namespace": "team", "labels": {"x": "y"}},
        "spec": {"template": {}, **spec},
    }


def test_only_applies_of_spec_replicas_count_as_appliers() -> None:
    fields = [
        managed(FIELD_MANAGER, "Apply", HPA_SPEC_FIELDS),
        managed("kube-controller-manager", "Update", HPA_SPEC_FIELDS),  # the HPA scales with updates
        managed("someone", "Apply", {"f:spec": {"f:template": {}}}),
        managed("status-writer", "Apply", {"f:status": {"f:replicas": {}}}),
    ]
    assert replicas_appliers(fields) == frozenset({FIELD_MANAGER})
    assert replicas_appliers([]) == frozenset()


def test_a_deployment_view_carries_its_replicas_appliers() -> None:
    body = {"metadata": {"managedFields": [managed(FIELD_MANAGER, "Apply", HPA_SPEC_FIELDS)]}, "spec": {"replicas": 3}}
    view = DeploymentView.parse(body)
    assert (view.desired, view.replicas_appliers) == (3, frozenset({FIELD_MANAGER}))


def test_releasing_replicas_the_operator_applied_keeps_the_live_count() -> None:
    body = replicas_handover(desired(), 3, frozenset({FIELD_MANAGER, "other"}))
    assert body == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "model-a", "namespace": "team"},  # only what the handover manager owns
        "spec": {"replicas": 3},
    }


@pytest.mark.parametrize(
    ("spec", "appliers"),
    [
        ({"replicas": 2}, frozenset({FIELD_MANAGER})),  # still pinned or fixed: the operator keeps them
        ({}, frozenset()),  # the HPA already owns them (a steady state, or the handover was done)
        ({}, frozenset({"servlane-operator-replicas-handover"})),
    ],
)
def test_no_handover_when_nothing_would_drop(spec: dict[str, Any], appliers: frozenset[str]) -> None:
    assert replicas_handover(desired(**spec), 2, appliers) is None
