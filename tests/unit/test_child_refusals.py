"""A child the API server refuses (or the builders fail on) is reported in status (Degraded, ChildRejected, its
own message): an invalid one (422) is not retried until the spec changes; a forbidden one (403: a policy or
webhook that says so, a quota, the operator's RBAC) or a webhook's 400 is tried again, slowly, since the cluster
may come to allow it. Other failures (a conflict, the API server unavailable) are retried soon, with nothing in
status."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from servlane_api.conditions import CHILD_REJECTED
from servlane_operator import aimodel_reconciler
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model
from tests.unit.fake_kube import FakeKube

DEPLOYMENT = "/apis/apps/v1/namespaces/team-a/deployments/model-llama"  # make_model's namespace and name
SETTINGS = OperatorSettings(gateway_namespace="servlane-system")

REFUSAL = 'deployments.apps "model-llama" is forbidden: pod affinity is not allowed in this namespace'


class RefusingKube(FakeKube):
    """Refuses every apply of the Deployment with `status`."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    def _call(self, method: str, path: str, *, body: Any = None, **kwargs: Any) -> dict[str, Any]:
        if method == "PATCH" and path == DEPLOYMENT:
            self.calls.append((method, path))
            error = ApiException(status=self.status, reason="Refused")
            error.body = json.dumps({"kind": "Status", "message": REFUSAL, "code": self.status})
            raise error
        return super()._call(method, path, body=body, **kwargs)


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "event", lambda *_args, **_kwargs: None)


def reconcile(kube: FakeKube) -> None:
    body = make_model({"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "2"}})
    asyncio.run(
        aimodel_reconciler.reconcile(body.model_dump(by_alias=True, mode="json"), kube, SETTINGS, [], trigger="change")
    )


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


@pytest.mark.parametrize(
    ("status", "raised", "delay"),
    [
        (422, kopf.PermanentError, None),
        (403, kopf.TemporaryError, aimodel_reconciler.REFUSED_RETRY_SECONDS),
        (400, kopf.TemporaryError, aimodel_reconciler.REFUSED_RETRY_SECONDS),
    ],
)
def test_a_refused_child_is_in_status(status: int, raised: type[Exception], delay: int | None) -> None:
    kube = RefusingKube(status)
    with pytest.raises(raised, match="is forbidden: pod affinity") as caught:
        reconcile(kube)
    if delay is not None:
        assert isinstance(caught.value, kopf.TemporaryError)
        assert caught.value.delay == delay
    (written,) = kube.statuses
    assert (degraded(written)["reason"], degraded(written)["status"]) == (CHILD_REJECTED, "True")
    assert REFUSAL in degraded(written)["message"]
    assert written["phase"] == "Failed"


@pytest.mark.parametrize("status", [409, 500, 503])
def test_other_failures_are_retried_soon_with_nothing_in_status(status: int) -> None:
    kube = RefusingKube(status)
    with pytest.raises(kopf.TemporaryError) as caught:
        reconcile(kube)
    assert caught.value.delay == 5
    assert kube.statuses == []


def test_a_spec_the_builders_fail_on_is_reported_once_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder's exception (llamacpp's float('1k') was one) went to kopf's retry loop for good, with nothing in
    status: the builders are pure, so the same spec fails again. Now status says it and it is not retried."""

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("could not convert string to float: '1k'")

    monkeypatch.setattr(aimodel_reconciler, "plan_children", broken)
    kube = FakeKube()
    with pytest.raises(kopf.PermanentError, match="could not build"):
        reconcile(kube)
    (written,) = kube.statuses
    assert degraded(written)["reason"] == CHILD_REJECTED
    assert "ValueError: could not convert string to float: '1k'" in degraded(written)["message"]
    assert written["phase"] == "Failed"
    assert [(method, path.endswith("/status")) for method, path in kube.calls] == [("PATCH", True)]  # nothing else
