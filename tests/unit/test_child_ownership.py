"""The operator changes and deletes only the children it owns (issue #28.5).

An object named `model-<name>` that this AIModel is not the controller of (by uid) is neither applied
over nor deleted: the AIModel reports Ready=False, reason ChildConflict, and the rest of its children
are reconciled as usual. Pure decision in builders/ownership.py; the reconciler against an in-memory
API server behind the real client (tests/unit/fake_kube.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from servlane_api.conditions import CHILD_CONFLICT
from servlane_operator import aimodel_reconciler
from servlane_operator.builders.ownership import Ownership, child_actions, ownership
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model
from tests.unit.fake_kube import FakeKube

UID = "uid-123"  # make_model's
NS, CHILD = "team-a", "model-llama"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/{CHILD}"
SERVICE = f"/api/v1/namespaces/{NS}/services/{CHILD}"
HPA = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/{CHILD}"
CPU_SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "2"}}


def controller(uid: str, *, is_controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "name": "llama",
        "uid": uid,
        "controller": is_controller,
    }


def obj(kind: str, *owners: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": CHILD, "namespace": NS, "uid": "live-uid", "ownerReferences": list(owners)},
        **extra,
    }


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (None, Ownership.ABSENT),
        (obj("Service", controller(UID)), Ownership.OWNED),
        (obj("Service"), Ownership.FOREIGN),  # no owner: made by hand or by a chart
        (obj("Service", controller("uid-of-a-deleted-llama")), Ownership.FOREIGN),  # same name, other object
        (obj("Service", controller(UID, is_controller=False)), Ownership.FOREIGN),  # referenced, not controlled
        (obj("Service", controller("other-uid"), controller(UID, is_controller=False)), Ownership.FOREIGN),
        ({"kind": "Service", "metadata": {"name": CHILD}}, Ownership.FOREIGN),
    ],
)
def test_only_a_controller_reference_with_the_models_uid_is_ownership(
    live: dict[str, Any] | None, expected: Ownership
) -> None:
    assert ownership(live, UID) is expected


def test_an_empty_uid_owns_nothing() -> None:
    """A model read without its uid must not match a reference whose uid is empty too."""
    assert ownership(obj("Service", controller("")), "") is Ownership.FOREIGN


def test_child_actions_skip_and_report_foreign_objects() -> None:
    apply = [obj("Deployment"), obj("Service"), obj("ConfigMap")]
    delete = [("autoscaling/v2", "HorizontalPodAutoscaler"), ("networking.k8s.io/v1", "NetworkPolicy")]
    live = {
        "Deployment": obj("Deployment", controller(UID)),
        "Service": obj("Service"),
        "ConfigMap": None,
        "HorizontalPodAutoscaler": obj("HorizontalPodAutoscaler", controller(UID)),
        "NetworkPolicy": obj("NetworkPolicy", controller("someone-else")),
    }
    actions = child_actions(apply, delete, live, UID)
    assert [o["kind"] for o in actions.apply] == ["Deployment", "ConfigMap"]
    assert actions.delete == [("autoscaling/v2", "HorizontalPodAutoscaler", "live-uid")]
    assert len(actions.conflicts) == 2
    assert "Service model-llama" in actions.conflicts[0]
    assert "not owned by this AIModel" in actions.conflicts[0]
    assert "NetworkPolicy model-llama" in actions.conflicts[1]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """kopf's Events (posted by its own task in a running operator), recorded instead."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "warn", lambda _body, *, reason, message: posted.append((reason, message)))
    monkeypatch.setattr(kopf, "info", lambda _body, *, reason, message: posted.append((reason, message)))
    monkeypatch.setattr(kopf, "event", lambda _body, *, type, reason, message: posted.append((reason, message)))
    return posted


def body_of(spec: dict[str, Any], **status: Any) -> dict[str, Any]:
    return make_model(spec, **status).model_dump(by_alias=True, mode="json")


SETTINGS = OperatorSettings(gateway_namespace="servlane-system")


def reconcile(kube: FakeKube, body: dict[str, Any], trigger: str = "change") -> None:
    asyncio.run(aimodel_reconciler.reconcile(body, kube, SETTINGS, [], trigger=trigger))


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_a_foreign_service_is_left_alone_and_reported(events: list[tuple[str, str]]) -> None:
    kube = FakeKube()
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": CHILD, "namespace": NS},
        "spec": {"ports": [{"port": 5432}]},
    }
    kube.put(SERVICE, theirs)
    reconcile(kube, body_of(CPU_SPEC))
    assert kube.objects[SERVICE] == theirs  # not taken over: no ownerReference, no new spec
    assert ("PATCH", SERVICE) not in kube.calls
    assert DEPLOYMENT in kube.objects  # the rest of the children are applied
    (status,) = kube.statuses
    ready = ready_condition(status)
    assert (ready["status"], ready["reason"]) == ("False", CHILD_CONFLICT)
    assert "Service model-llama" in ready["message"]
    assert "not owned by this AIModel" in ready["message"]
    assert status["phase"] == "Degraded"
    assert (CHILD_CONFLICT, ready["message"]) in events


def test_a_deployment_of_a_deleted_model_of_the_same_name_is_not_taken_over(events: list[tuple[str, str]]) -> None:
    kube = FakeKube()
    old = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": CHILD, "namespace": NS, "ownerReferences": [controller("uid-of-a-deleted-llama")]},
        "spec": {"replicas": 7},
    }
    kube.put(DEPLOYMENT, old)
    reconcile(kube, body_of(CPU_SPEC))
    assert kube.objects[DEPLOYMENT]["spec"] == {"replicas": 7}
    assert ready_condition(kube.statuses[-1])["reason"] == CHILD_CONFLICT
    assert "Deployment model-llama" in ready_condition(kube.statuses[-1])["message"]


def test_a_foreign_hpa_is_not_deleted_when_autoscaling_is_off(events: list[tuple[str, str]]) -> None:
    kube = FakeKube()
    theirs = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": CHILD, "namespace": NS},
    }
    kube.put(HPA, theirs)
    reconcile(kube, body_of(CPU_SPEC))
    assert HPA in kube.objects
    assert ("DELETE", HPA) not in kube.calls
    assert "HorizontalPodAutoscaler model-llama" in ready_condition(kube.statuses[-1])["message"]


def test_an_owned_hpa_is_deleted_by_its_uid(events: list[tuple[str, str]]) -> None:
    kube = FakeKube()
    kube.put(
        HPA, {"kind": "HorizontalPodAutoscaler", "metadata": {"name": CHILD, "ownerReferences": [controller(UID)]}}
    )
    reconcile(kube, body_of(CPU_SPEC))
    assert HPA not in kube.objects
    assert ready_condition(kube.statuses[-1])["reason"] != CHILD_CONFLICT
    assert events == [] or all(reason != CHILD_CONFLICT for reason, _ in events)


def test_owned_children_are_applied_and_a_cleared_conflict_clears_the_condition(
    events: list[tuple[str, str]],
) -> None:
    kube = FakeKube()
    kube.put(SERVICE, {"kind": "Service", "metadata": {"name": CHILD, "namespace": NS}})
    reconcile(kube, body_of(CPU_SPEC))
    conflicted = kube.statuses[-1]
    assert ready_condition(conflicted)["reason"] == CHILD_CONFLICT
    # Status refreshes between reconciles (child events) keep the conflict: only a reconcile reads owners.
    refreshed = FakeKube()
    asyncio.run(aimodel_reconciler.refresh_status(body_of(CPU_SPEC, **conflicted), refreshed, SETTINGS, None, []))
    (status,) = refreshed.statuses  # written: the refresh read no Deployment, so its counts differ
    assert ready_condition(status)["reason"] == CHILD_CONFLICT
    # A resync that finds the same conflict does not post its Event again.
    posted = len(events)
    reconcile(kube, body_of(CPU_SPEC, **conflicted), trigger="resync")
    assert [reason for reason, _ in events[posted:]] == []
    del kube.objects[SERVICE]  # its owner removed it
    reconcile(kube, body_of(CPU_SPEC, **conflicted), trigger="resync")
    owners = kube.objects[SERVICE]["metadata"]["ownerReferences"]
    assert [(o["uid"], o["controller"]) for o in owners] == [(UID, True)]
    assert ready_condition(kube.statuses[-1])["reason"] != CHILD_CONFLICT
    # And once ours, the next reconcile applies over it as before.
    calls = len(kube.calls)
    reconcile(kube, body_of(CPU_SPEC), trigger="resync")
    assert ("PATCH", SERVICE) in kube.calls[calls:]
