"""One writer at a time per object (object_locks) and the feature status a pass plans from (written_status)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf
import pytest

from servlane_operator import handlers
from servlane_operator.context import OperatorContext
from servlane_operator.indexes import Indexes
from servlane_operator.lanes import Priority
from servlane_operator.model_passes import apply_model
from servlane_operator.object_locks import ObjectLocks
from servlane_operator.settings import OperatorSettings
from servlane_operator.written_status import WrittenStatuses
from tests.unit.fake_kube import FakeKube

NS, NAME = "team-a", "llama"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/model-{NAME}"


def test_holders_of_one_key_take_turns_and_other_keys_do_not_wait() -> None:
    async def scenario() -> list[str]:
        locks = ObjectLocks()
        order: list[str] = []
        first_in = asyncio.Event()
        release_first = asyncio.Event()

        async def first() -> None:
            async with locks.hold("a"):
                order.append("first in")
                first_in.set()
                await release_first.wait()
                order.append("first out")

        async def second() -> None:
            async with locks.hold("a"):
                order.append("second in")

        async def other() -> None:
            async with locks.hold("b"):
                order.append("other in")

        task = asyncio.create_task(first())
        await first_in.wait()
        waiting = asyncio.create_task(second())
        await asyncio.wait_for(other(), timeout=5)  # another key does not wait for "a"
        await asyncio.sleep(0)
        assert "second in" not in order
        release_first.set()
        await asyncio.wait_for(asyncio.gather(task, waiting), timeout=5)
        assert len(locks) == 0  # nothing left behind once nobody holds or waits
        return order

    assert asyncio.run(scenario()) == ["first in", "other in", "first out", "second in"]


def test_a_lock_is_released_when_its_holder_fails_or_is_cancelled() -> None:
    async def scenario() -> None:
        locks = ObjectLocks()
        with pytest.raises(RuntimeError):
            async with locks.hold("a"):
                raise RuntimeError("boom")
        held = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("a"):
                held.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(holder())
        await held.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5), locks.hold("a"):
            pass
        assert len(locks) == 0

    asyncio.run(scenario())


def feature(status: dict[str, Any], uid: str = "f-1") -> dict[str, Any]:
    return {"metadata": {"name": "chat", "namespace": NS, "uid": uid}, "spec": {"model": NAME}, "status": status}


def test_a_copy_behind_this_process_writes_gets_the_last_write_and_any_other_copy_wins() -> None:
    statuses = WrittenStatuses()
    at_0, at_50, at_100 = {"canaryWeight": 0}, {"canaryWeight": 50}, {"canaryWeight": 100}
    statuses.wrote(feature(at_0), at_50)
    statuses.wrote(feature(at_50), at_100)  # planned from its own last write (the copy was behind)
    assert statuses.latest(feature(at_0))["status"] == at_100  # two writes behind
    assert statuses.latest(feature(at_50))["status"] == at_100  # one write behind
    arrived = feature(at_100)
    assert statuses.latest(arrived) is arrived
    someone_else = feature({"canaryWeight": 10})  # another replica led and wrote after this one
    assert statuses.latest(someone_else) is someone_else
    assert statuses.latest(feature(at_0, uid="f-2"))["status"] == at_0  # a recreated feature: its own
    statuses.wrote(someone_else, {"canaryWeight": 20})  # planned from a status not ours: a new chain
    assert statuses.latest(feature(at_0))["status"] == at_0
    assert statuses.latest(someone_else)["status"] == {"canaryWeight": 20}
    statuses.forget("f-1")
    assert statuses.latest(someone_else)["status"] == {"canaryWeight": 10}
    assert len(statuses) == 0


def model_body(min_replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": NAME, "namespace": NS, "uid": "uid-1", "generation": 1},
        "spec": {
            "source": {"uri": "/models/tiny"},
            "engine": "transformers",
            "autoscaling": {"minReplicas": min_replicas, "maxReplicas": 4},
        },
        "status": {"observedGeneration": 1},
    }


def pinned_by(replicas: int) -> dict[str, Any]:
    status = {"stableModel": "old", "canaryModel": NAME, "replicaOverrides": [{"model": NAME, "replicas": replicas}]}
    return feature(status)


def resync(context: OperatorContext, indexes: dict[str, Any]) -> Any:
    """The periodic resync's pass of the one model."""
    return apply_model(context, Indexes(indexes), (NS, NAME), trigger="resync", priority=Priority.RESYNC)


@pytest.fixture
def quiet_events(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("event", "info", "warn"):
        monkeypatch.setattr(kopf, name, lambda *_args, **_kw: None)


class HeldKube(FakeKube):
    """Holds the first Deployment apply in flight until told, as a slow API server would."""

    def __init__(self) -> None:
        super().__init__()
        self.first_apply_started = threading.Event()
        self.let_first_apply_finish = threading.Event()

    def _call(self, method: str, path: str, *, body: Any = None, **kw: Any) -> dict[str, Any]:
        if method == "PATCH" and path == DEPLOYMENT and not self.first_apply_started.is_set():
            self.first_apply_started.set()
            assert self.let_first_apply_finish.wait(timeout=10)
        return super()._call(method, path, body=body, **kw)


@pytest.mark.usefixtures("quiet_events")
def test_a_resync_in_flight_cannot_undo_a_newer_pin_applied_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in CI as [2, 1, 2, 1, 2]: a pass that read the model's pin before an await applied it after
    a newer pass had applied the next pin. Each writer now holds the model and reads the pin inside."""
    kube = HeldKube()
    memo = OperatorContext.create(OperatorSettings(gateway_namespace="gw"), kube=kube)
    monkeypatch.setattr(handlers, "start_loops", lambda context, indexes: None)  # no loops in this test
    indexes: dict[str, Any] = {
        "aimodels_by_key": {(NS, NAME): [model_body()]},
        "deployments_by_model": {},
        "pods_by_model": {},
        "aifeatures_by_namespace": {NS: [pinned_by(1)]},
    }

    async def scenario() -> None:
        in_flight = asyncio.create_task(resync(memo, indexes))
        await asyncio.to_thread(kube.first_apply_started.wait, 10)
        indexes["aifeatures_by_namespace"] = {NS: [pinned_by(2)]}  # the rollout moved on meanwhile
        change_handler: Any = handlers.reconcile_model  # kopf's decorator types it as a handler
        change = asyncio.create_task(
            change_handler(body=model_body(), reason=kopf.Reason.UPDATE, namespace=NS, name=NAME, memo=memo, **indexes)
        )
        await asyncio.sleep(0.05)
        kube.let_first_apply_finish.set()
        await asyncio.wait_for(asyncio.gather(in_flight, change), timeout=10)

    asyncio.run(scenario())
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 2


@pytest.mark.usefixtures("quiet_events")
def test_a_resync_reads_the_pin_this_process_wrote_when_the_feature_index_is_behind() -> None:
    """Seen in CI: right after the budget pinned a canary to 1, a resync read the feature's copy from
    before that write (no pin) and put the canary back at its own 2 for one pass."""
    kube = FakeKube()
    memo = OperatorContext.create(OperatorSettings(gateway_namespace="gw"), kube=kube)
    before_the_pin = feature({"stableModel": "old", "canaryModel": NAME})
    memo.feature_statuses.wrote(before_the_pin, pinned_by(1)["status"])
    indexes: dict[str, Any] = {
        "aimodels_by_key": {(NS, NAME): [model_body(min_replicas=2)]},
        "deployments_by_model": {},
        "pods_by_model": {},
        "aifeatures_by_namespace": {NS: [before_the_pin]},  # the watch has not brought the pin yet
    }
    asyncio.run(resync(memo, indexes))
    assert kube.objects[DEPLOYMENT]["spec"]["replicas"] == 1
