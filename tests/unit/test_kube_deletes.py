"""The operator's client remembers the children it deleted, so that a reconcile does not DELETE an absent HPA
(a 404 round trip) every time, and asks again on the periodic resync or after it applied that child."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes.client.exceptions import ApiException

from servlane_operator.kube import Kube


class RecordingKube(Kube):
    """The real client class; only the HTTP call is replaced by an API server that holds nothing."""

    def __init__(self) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str]] = []

    def _call(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if method == "DELETE":
            raise ApiException(status=404, reason="Not Found")
        return {}


HPA = ("autoscaling/v2", "HorizontalPodAutoscaler", "team-a", "model-llama")
HPA_OBJECT = {
    "apiVersion": "autoscaling/v2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {"namespace": "team-a", "name": "model-llama"},
}


def deletes(kube: RecordingKube) -> int:
    return sum(method == "DELETE" for method, _ in kube.calls)


def test_an_absent_child_is_deleted_once_until_applied_or_resynced() -> None:
    async def scenario() -> None:
        kube = RecordingKube()
        assert await kube.delete(*HPA, recheck=False) is False
        assert await kube.delete(*HPA, recheck=False) is False
        assert deletes(kube) == 1  # the second one trusted the first
        assert await kube.delete(*HPA) is False  # a resync asks the API server again
        assert deletes(kube) == 2
        await kube.apply(HPA_OBJECT)  # it exists again: the next delete must be sent
        await kube.delete(*HPA, recheck=False)
        assert deletes(kube) == 3
        other = ("autoscaling/v2", "HorizontalPodAutoscaler", "team-b", "model-llama")
        await kube.delete(*other, recheck=False)  # another namespace's child is another child
        assert deletes(kube) == 4

    asyncio.run(scenario())
