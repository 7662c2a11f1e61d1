"""Cold starts explained (#30 item 3): the pure breakdown of a pod's start, what status.coldStart keeps, and
the operator's reader (a pod's events and its runtime's /startup in, one status write out)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from servlane_api.cold_start import MAX_COLD_START_SAMPLES, ColdStartSample, ColdStartStatus, RuntimeStartup
from servlane_core.cold_start import breakdown, median_phases, needs_sample, record_start, runtime_steps
from servlane_operator.cold_start_reader import COLD_START_SECONDS, STARTUP_MAX_BYTES, ColdStartReader
from tests.support.cold_start import STARTUP, T0, pod, pulled, stamp
from tests.unit.fake_kube import FakeKube


def test_each_step_of_a_start_from_the_pod_its_events_and_its_runtime() -> None:
    sample = breakdown(pod(), [pulled(2)], STARTUP)
    assert sample is not None
    assert sample.pod == "model-tiny-abc"
    assert sample.created == stamp(0)
    steps = sample.model_dump(exclude={"pod", "created"})
    assert steps == {
        "scheduled": 1.0,
        "image_ready": 1.0,
        "container_started": 1.2,  # to the process's own start, finer than startedAt's whole second
        "runtime_imports": 1.5,
        "weights_fetched": 0.1,
        "engine_loaded": 4.2,
        "runtime_ready": 0.5,
        "pod_ready": 4.5,  # the kubelet's probe saw it 4.5 s after the runtime was ready
        "first_token": 6.25,
        "total": 14.0,
    }


def test_without_a_pulled_event_the_image_was_ready_when_the_container_started() -> None:
    others = [pulled(0.5, uid="someone-else"), pulled(0.5, field="spec.initContainers{init}")]
    sample = breakdown(pod(), others, STARTUP)
    assert sample is not None
    assert (sample.image_ready, sample.container_started) == (2.0, 0.2)


def test_without_the_runtimes_answer_its_steps_are_unknown_not_folded_into_one() -> None:
    sample = breakdown(pod(), [pulled(2)], None)
    assert sample is not None
    assert (sample.scheduled, sample.image_ready, sample.container_started) == (1.0, 1.0, 1.0)
    runtime = (sample.runtime_imports, sample.weights_fetched, sample.engine_loaded, sample.runtime_ready)
    assert runtime == (None, None, None, None)
    assert (sample.pod_ready, sample.first_token, sample.total) == (None, None, 14.0)


def test_a_pod_not_ready_has_no_start_to_tell_and_no_step_is_negative() -> None:
    assert breakdown(pod(ready=None), [], STARTUP) is None
    # The runtime's ready a fraction after the whole second Kubernetes recorded for Ready.
    early = breakdown(pod(ready=9), [pulled(2)], STARTUP)
    assert early is not None
    assert early.pod_ready == 0.0


def sample(name: str, created: float, total: float, first_token: float | None = 1.0) -> ColdStartSample:
    return ColdStartSample(pod=name, created=stamp(created), total=total, scheduled=1.0, first_token=first_token)


def test_status_keeps_the_most_recent_starts_their_median_and_the_last() -> None:
    status: ColdStartStatus | None = None
    for i in range(MAX_COLD_START_SAMPLES + 3):
        status = record_start(status, sample(f"p{i}", created=i, total=float(i)))
    assert status is not None
    assert [s.pod for s in status.recent] == [f"p{i}" for i in range(3, MAX_COLD_START_SAMPLES + 3)]
    assert status.last is not None
    assert status.last.pod == f"p{MAX_COLD_START_SAMPLES + 2}"
    assert status.median is not None
    assert status.median.total == 7.5
    assert status.median.scheduled == 1.0
    assert status.median.engine_loaded is None  # no sample knows it

    # A pod recorded again (its first token came since) replaces its own sample, in its place.
    before = record_start(record_start(None, sample("a", 0, 10.0, None)), sample("b", 5, 20.0))
    assert needs_sample(before, "a")
    assert not needs_sample(before, "b")
    assert needs_sample(before, "c")
    after = record_start(before, sample("a", 0, 10.0, 3.0))
    assert [(s.pod, s.first_token) for s in after.recent] == [("a", 3.0), ("b", 1.0)]
    assert after.last is not None
    assert after.last.pod == "b"
    # A start older than the kept ones changes nothing.
    full = status
    assert record_start(full, sample("old", created=-5, total=1.0)) == full
    assert median_phases([]).total is None


class ModelKube(FakeKube):
    """The AIModel, its pods' events and status patches merged the way the API server merges them."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__()
        self.events = events
        self.event_queries: list[Any] = []
        self.after_status: Callable[[], object] = lambda: None
        self.put("/apis/servlane.dev/v1alpha1/namespaces/team-a/aimodels/tiny", {"status": {"phase": "Ready"}})

    @property
    def model(self) -> dict[str, Any]:
        return self.objects["/apis/servlane.dev/v1alpha1/namespaces/team-a/aimodels/tiny"]

    def _call(self, method: str, path: str, *, body: Any = None, query: Any = None, **kw: Any) -> dict[str, Any]:
        if path == "/api/v1/namespaces/team-a/events":
            self.event_queries.append(query)
            return {"items": self.events}
        result = super()._call(method, path, body=body, **kw)
        if path.endswith("/status"):
            self.model["status"] = {**self.model["status"], **body["status"]}
            self.after_status()
        return result


def serving(answers: dict[str, httpx.Response]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/startup"
        assert request.url.port == 9090
        return answers.get(str(request.url.host), httpx.Response(503))

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def startup_answer(startup: RuntimeStartup) -> httpx.Response:
    return httpx.Response(200, content=startup.model_dump_json())


async def settle(reader: ColdStartReader) -> None:
    while reader._tasks:
        await asyncio.gather(*list(reader._tasks))


async def test_the_reader_writes_a_ready_pods_start_once_and_two_at_once_both_land() -> None:
    kube = ModelKube([pulled(2), pulled(2, uid="uid-2")])
    client = serving({"10.0.0.7": startup_answer(STARTUP), "10.0.0.8": startup_answer(STARTUP)})
    reader = ColdStartReader(kube, client, rechecks=())
    before = COLD_START_SECONDS.labels("team-a", "tiny", "total")._sum.get()

    reader.observe(pod(ready=None))  # not ready: nothing read
    await settle(reader)
    assert kube.statuses == []

    reader.observe(pod())
    reader.observe(pod())  # the same pod again while it is read
    reader.observe(pod("model-tiny-def", uid="uid-2", ip="10.0.0.8"))
    await settle(reader)
    cold = ColdStartStatus.model_validate(kube.model["status"]["coldStart"])
    assert sorted(s.pod for s in cold.recent) == ["model-tiny-abc", "model-tiny-def"]
    assert cold.recent[0].pod_ready == 4.5
    assert cold.recent[0].first_token == 6.25
    assert len(kube.statuses) == 2
    assert kube.model["status"]["phase"] == "Ready"  # only coldStart written
    assert ("fieldSelector", "involvedObject.kind=Pod,involvedObject.name=model-tiny-abc,involvedObject.uid=uid-1") in [
        q for queries in kube.event_queries for q in queries
    ]
    assert COLD_START_SECONDS.labels("team-a", "tiny", "total")._sum.get() == before + 28.0

    reader.observe(pod())  # recorded and complete: not read again
    await settle(reader)
    assert len(kube.statuses) == 2
    reader.forget_model("team-a", "tiny")
    await reader.aclose()


async def test_a_first_token_that_comes_later_is_read_again() -> None:
    kube = ModelKube([pulled(2)])
    no_token = RuntimeStartup(phases={k: v for k, v in STARTUP.phases.items() if k != "first_token"})
    answers = {"10.0.0.7": startup_answer(no_token)}
    reader = ColdStartReader(kube, serving(answers), rechecks=(0.01, 0.01))

    # The first token is served just after the first write: the rechecks find it.
    kube.after_status = lambda: answers.update({"10.0.0.7": startup_answer(STARTUP)})
    reader.observe(pod())
    await settle(reader)
    cold = ColdStartStatus.model_validate(kube.model["status"]["coldStart"])
    assert cold.last is not None
    assert cold.last.first_token == 6.25
    assert len(kube.statuses) == 2
    await reader.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b"{" + b" " * STARTUP_MAX_BYTES + b"}"),  # too long
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, content=json.dumps({"phases": {"ready": -5}}).encode()),
        httpx.Response(302, headers={"location": "http://169.254.169.254/"}),  # never followed
        httpx.Response(404),
    ],
)
async def test_a_hostile_or_broken_runtime_answer_leaves_only_kubernetes_steps(answer: httpx.Response) -> None:
    kube = ModelKube([pulled(2)])
    reader = ColdStartReader(kube, serving({"10.0.0.7": answer}), rechecks=())
    reader.observe(pod())
    await settle(reader)
    cold = ColdStartStatus.model_validate(kube.model["status"]["coldStart"])
    assert cold.last is not None
    assert (cold.last.scheduled, cold.last.total, cold.last.engine_loaded) == (1.0, 14.0, None)
    await reader.aclose()


async def test_a_pod_writes_only_its_own_models_status_in_its_own_namespace() -> None:
    kube = ModelKube([])
    reader = ColdStartReader(kube, serving({}), rechecks=())
    other = pod()
    other["metadata"]["labels"]["servlane.dev/model"] = "not-there"
    reader.observe(other)
    await settle(reader)
    assert kube.statuses == []  # no AIModel of that name in team-a: nothing written anywhere
    assert all(path.startswith("/apis/servlane.dev/v1alpha1/namespaces/team-a/") for _, path in kube.calls)
    await reader.aclose()


def test_without_a_pod_the_runtimes_own_steps_are_its_start() -> None:
    steps = runtime_steps(STARTUP)
    assert steps.model_dump(exclude_none=True) == {
        "runtime_imports": 1.5,
        "weights_fetched": 0.1,
        "engine_loaded": 4.2,
        "runtime_ready": 0.5,
        "first_token": 10.75,  # from the runtime's own ready
        "total": 6.3,
    }
    assert runtime_steps(RuntimeStartup(phases={"process_start": T0})).total is None
