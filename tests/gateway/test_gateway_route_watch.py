"""The in-cluster route source without an API server: the watch events are handed to KubeRouteSource as its
watch threads would, and the tables it publishes are checked.

Two properties: a backend is always the AIModel's own Service (never what its status says), and the table
is rebuilt off the event loop, coalesced, and only when something routing reads changed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servlane_api import AIFeature, AIModel
from servlane_api import metric_names as contract
from servlane_core.routing.routes import RouteTable, build_route_table
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.routing.kube_watch import KubeRouteSource, RouteObjectStore, routing_view
from servlane_gateway.routing.sources import FileRouteSource, flatten_documents, parse_objects
from tests.support.gateway_harness import aifeature, aimodel, route_in
from tests.support.loop_lag import LoopLag

FEATURES = ("aifeatures", "")
MODELS = ("aimodels", "")
OTHER_TEAMS_SERVICE = "http://model-chat.team-a.svc.cluster.local:8000/v1"


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "namespace": namespace}}


def with_adapter(obj: dict[str, Any], adapter: str) -> dict[str, Any]:
    spec = {**obj["spec"], "adapters": [{"name": adapter, "source": f"/adapters/{adapter}"}]}
    return obj | {"spec": spec}


async def until(what: str, check: Callable[[], object], within: float = 60.0) -> None:
    """Polls `check` on the event loop (so the loop keeps running the source's callbacks) until it holds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.005)  # the polling interval of a deadline-bounded wait


class Published:
    """The tables a source hands to the event loop, and the thread each was handed over on."""

    def __init__(self) -> None:
        self.tables: list[RouteTable] = []
        self.threads: set[int] = set()

    def __call__(self, table: RouteTable) -> None:
        self.tables.append(table)
        self.threads.add(threading.get_ident())

    @property
    def latest(self) -> RouteTable:
        assert self.tables, "no table published"
        return self.tables[-1]


# -- upstreams come from the AIModel's name and namespace -------------------------------------------------


def test_in_the_cluster_a_backend_is_its_models_own_service_whatever_the_status_says() -> None:
    # Team B may patch its AIModel's status: it names team A's Service as the endpoint.
    hijack = with_adapter(in_namespace(aimodel("chat", OTHER_TEAMS_SERVICE, served="chat"), "team-b"), "sql")
    feature = in_namespace(aifeature("assistant", [("chat", 100)]), "team-b")
    features, models = parse_objects(flatten_documents([hijack, feature]))
    table = build_route_table(features, models, ["team-b"], cluster_domain="corp.example")
    own = "http://model-chat.team-b.svc.corp.example:8000"
    assert route_in(table, "team-b/chat").backends[0].base_url == own
    assert route_in(table, "team-b/sql").backends[0].base_url == own  # the adapter: the same pods
    assert route_in(table, "team-b/assistant").backends[0].base_url == own
    assert route_in(table, "team-b/assistant").backends[0].ready  # the endpoint still says it is up


def test_the_status_endpoint_is_only_a_readiness_signal_in_the_cluster() -> None:
    features, models = parse_objects([aimodel("chat", None), aimodel("up", "http://anything.example/v1")])
    table = build_route_table(features, models, ["default"], cluster_domain="cluster.local")
    no_endpoint = route_in(table, "chat").backends[0]
    assert (no_endpoint.base_url, no_endpoint.ready) == ("", False)
    assert route_in(table, "up").backends[0].base_url == "http://model-up.default.svc.cluster.local:8000"


def test_a_routes_file_still_calls_the_status_endpoint() -> None:
    # `servlane serve` writes the file itself, pointing at the runtimes it started on loopback ports.
    features, models = parse_objects([aimodel("chat", "http://127.0.0.1:39001/v1")])
    table = build_route_table(features, models, ["default"])
    assert route_in(table, "chat").backends[0].base_url == "http://127.0.0.1:39001"


async def test_the_watch_source_builds_backends_from_names_with_its_cluster_domain() -> None:
    source = KubeRouteSource(cluster_domain="corp.example")
    published = Published()
    source.start_building(published)
    try:
        source.listed(FEATURES, [])
        source.listed(MODELS, [in_namespace(aimodel("chat", OTHER_TEAMS_SERVICE), "team-b")])
        await until("a table", lambda: published.tables)
        backend = route_in(published.latest, "team-b/chat").backends[0]
        assert backend.base_url == "http://model-chat.team-b.svc.corp.example:8000"
    finally:
        await source.stop()


# -- what needs a rebuild ------------------------------------------------------------------------------------


def noop_changes(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """The object with only what routing never reads changed."""
    changed = copy.deepcopy(obj)
    meta = changed["metadata"]
    meta["annotations"] = {"team.example/note": f"touched {i}"}
    meta["labels"] = {"team.example/owner": f"someone-{i}"}
    meta["resourceVersion"] = str(1000 + i)
    meta["managedFields"] = [{"manager": f"kubectl-{i}", "operation": "Update"}]
    phases = ("Deploying", "Ready") if changed["kind"] == "AIModel" else ("Progressing", "Stable")
    changed.setdefault("status", {})["phase"] = phases[i % 2]
    return changed


@pytest.mark.parametrize(
    ("before", "after", "rebuild"),
    [
        (aimodel("m", "http://a/v1"), noop_changes(aimodel("m", "http://a/v1"), 1), False),
        (aifeature("f", [("m", 100)]), noop_changes(aifeature("f", [("m", 100)]), 2), False),
        (aimodel("m", "http://a/v1"), aimodel("m", "http://b/v1"), True),  # status.endpoint
        (aimodel("m", "http://a/v1"), aimodel("m", "http://a/v1", ready=False), True),  # Ready condition
        (aimodel("m", "http://a/v1"), aimodel("m", "http://a/v1", status_served="x"), True),  # served name
        (aimodel("m", "http://a/v1"), aimodel("m", "http://a/v1", served="x"), True),  # spec
        (aimodel("m", "http://a/v1"), in_namespace(aimodel("m", "http://a/v1"), "other"), True),
        (aifeature("f", [("m", 100)]), aifeature("f", [("m", 60), ("n", 40)]), True),  # spec and weights
    ],
)
def test_only_changes_that_routing_reads_change_the_routing_view(
    before: dict[str, Any], after: dict[str, Any], rebuild: bool
) -> None:
    assert (routing_view(before) != routing_view(after)) is rebuild


def test_the_store_asks_for_a_rebuild_only_when_routing_changes_and_keeps_every_change() -> None:
    store = RouteObjectStore([FEATURES, MODELS])
    model = aimodel("m", "http://a/v1")
    assert store.replace(MODELS, [model])
    assert not store.synced  # features not listed yet: no partial table
    assert store.replace(FEATURES, [aifeature("f", [("m", 100)])])
    assert store.synced
    assert not store.replace(MODELS, [noop_changes(model, 1)])  # a relist with nothing new for routing
    touched = noop_changes(model, 2)
    assert not store.apply(MODELS, "MODIFIED", touched)
    assert store.typed()[1][0].status.phase == "Deploying"  # kept all the same: the console shows it
    assert store.apply(MODELS, "MODIFIED", aimodel("m", "http://a/v1", ready=False))
    assert not route_in(store.table(), "default/f").backends[0].ready
    assert store.apply(FEATURES, "MODIFIED", aifeature("f", [("n", 100)]))
    assert route_in(store.table(), "default/f").backends[0].model == "n"
    assert store.apply(MODELS, "ADDED", aimodel("n", "http://n/v1"))
    assert store.apply(MODELS, "DELETED", aimodel("n", "http://n/v1"))
    assert not store.apply(MODELS, "DELETED", aimodel("n", "http://n/v1"))  # gone already
    assert not store.apply(MODELS, "BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert store.table().lookup("default/n") is None


def test_an_object_turning_invalid_leaves_routing() -> None:
    store = RouteObjectStore([FEATURES, MODELS])
    store.replace(FEATURES, [])
    store.replace(MODELS, [aimodel("m", "http://a/v1")])
    broken = aimodel("m", "http://a/v1")
    broken["spec"]["servedModelName"] = "team/m"  # the CRD refuses `/`; parse_object leaves it out
    assert store.apply(MODELS, "MODIFIED", broken)
    assert store.table().lookup("default/m") is None


# -- rebuilds off the loop, coalesced ------------------------------------------------------------------------


def many(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    models = [in_namespace(aimodel(f"m{i}", f"http://x/{i}/v1"), f"team-{i % 50}") for i in range(count)]
    features = [aifeature(f"f{i}", [(f"m{i}", 100)], namespace=f"team-{i % 50}") for i in range(count)]
    return features, models


class TimedBuild:
    """build_route_table, recording the thread and the duration of every build."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.seconds: list[float] = []

    def __call__(self, features: list[AIFeature], models: list[AIModel], *, cluster_domain: str | None) -> RouteTable:
        self.threads.add(threading.get_ident())
        started = time.perf_counter()
        table = build_route_table(features, models, cluster_domain=cluster_domain)
        self.seconds.append(time.perf_counter() - started)
        return table


def ready_flipped(model: dict[str, Any], ready: bool) -> dict[str, Any]:
    return aimodel(model["metadata"]["name"], model["status"]["endpoint"], ready=ready) | {
        "metadata": model["metadata"]
    }


async def test_a_thousand_of_each_rebuild_off_the_loop_and_no_op_events_rebuild_nothing() -> None:
    features, models = many(1000)
    build = TimedBuild()
    source = KubeRouteSource(build=build)
    published = Published()
    source.start_building(published)
    try:
        # The watch threads parse what they list, off the loop.
        await asyncio.to_thread(source.listed, FEATURES, features)
        await asyncio.to_thread(source.listed, MODELS, models)
        await until("the first table", lambda: published.tables)
        assert len(published.latest.routes) == 2000

        # A burst of annotation, label, managedFields, resourceVersion and phase changes: no rebuild at all.
        builds = source.builder.builds
        for i in range(300):
            obj = models[i % len(models)] if i % 2 else features[i % len(features)]
            source.changed(MODELS if i % 2 else FEATURES, "MODIFIED", noop_changes(obj, i))
        target = models[7]
        source.changed(MODELS, "MODIFIED", ready_flipped(target, ready=False))  # one real change after them
        name = f"{target['metadata']['namespace']}/f7"
        await until("the real change", lambda: not route_in(published.latest, name).backends[0].ready)
        assert source.builder.builds == builds + 1  # the real change's build, and nothing for the burst

        # Real changes: the loop keeps running while the tables are built on the builder's thread.
        measured = len(build.seconds)
        with LoopLag() as lag:
            for ready in (True, False, True, False, True):
                source.changed(MODELS, "MODIFIED", ready_flipped(target, ready))
                await until("the change", lambda: route_in(published.latest, name).backends[0].ready is ready)  # noqa: B023 - awaited in the same turn
    finally:
        await source.stop()
    loop_thread = threading.get_ident()
    assert loop_thread not in build.threads  # every table was built off the event loop
    assert published.threads == {loop_thread}  # and handed to it
    # Generous (the machine may be busy): a build on the loop would stall it once per build, for that whole
    # build; off it, the loop waits only for its turns of the GIL (and whatever else the machine runs).
    builds_seconds = build.seconds[measured:]
    assert len(builds_seconds) == 5
    stalls = [stall for stall in lag.lags if stall >= min(builds_seconds) / 2]
    assert len(stalls) < len(builds_seconds), (stalls, builds_seconds)


async def test_a_routes_file_of_a_thousand_of_each_reloads_off_the_loop(tmp_path: Path) -> None:
    """The standalone gateway's source (a file): reading, validating and building run on a thread too."""
    features, models = many(1000)
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(features + models))
    source = FileRouteSource(path, poll_seconds=0.05)
    reads: list[float] = []
    read = source._read

    def timed_read() -> Any:
        started = time.perf_counter()
        try:
            return read()
        finally:
            reads.append(time.perf_counter() - started)

    source._read = timed_read  # type: ignore[method-assign]
    published = Published()
    await source.start(published)
    try:
        assert len(published.latest.routes) == 2000  # start() delivers the first table before it returns
        target = models[7]
        name = f"{target['metadata']['namespace']}/f7"
        with LoopLag() as lag:
            for round_, ready in enumerate((False, True, False), start=2):
                changed = [ready_flipped(m, ready) if m is target else m for m in models]
                (tmp_path / "next.json").write_text(json.dumps(features + changed))
                (tmp_path / "next.json").replace(path)  # whole, as a ConfigMap's symlink swap is
                await until("the reload", lambda: len(published.tables) == round_)  # noqa: B023 - awaited in the same turn
                assert route_in(published.latest, name).backends[0].ready is ready
    finally:
        await source.stop()
    assert published.threads == {threading.get_ident()}  # tables are handed to the loop
    # On the loop, each reload would stall it for the whole reload; off it, the loop waits for its GIL turns.
    assert len(reads) == 4, reads
    stalls = [stall for stall in lag.lags if stall >= min(reads[1:]) / 2]
    assert len(stalls) < 3, (stalls, reads)


async def test_a_burst_of_changes_during_a_build_makes_one_more_build() -> None:
    gate = threading.Event()
    started = threading.Event()
    build = TimedBuild()

    def held_build(features: list[AIFeature], models: list[AIModel], *, cluster_domain: str | None) -> RouteTable:
        started.set()
        assert gate.wait(30), "the test never released the build"
        return build(features, models, cluster_domain=cluster_domain)

    source = KubeRouteSource(build=held_build)
    published = Published()
    source.start_building(published)
    try:
        source.listed(FEATURES, [aifeature("f", [("m0", 100)])])
        source.listed(MODELS, [aimodel(f"m{i}", f"http://x/{i}/v1") for i in range(50)])
        assert await asyncio.to_thread(started.wait, 30)  # the first build runs, held
        for i in range(1, 50):  # 49 real changes while it runs
            source.changed(FEATURES, "MODIFIED", aifeature("f", [(f"m{i}", 100)]))
        gate.set()
        await until(
            "the last change",
            lambda: published.tables and published.latest.routes["default/f"].backends[0].model == "m49",
        )
        assert source.builder.builds == 2  # the held one, then one for the whole burst
        assert len(published.tables) == 2
    finally:
        gate.set()
        await source.stop()


async def test_nothing_is_published_until_every_stream_has_listed() -> None:
    source = KubeRouteSource(namespaces=["team-a", "team-b"])
    published = Published()
    source.start_building(published)
    try:
        source.listed(("aimodels", "team-a"), [in_namespace(aimodel("m", "http://m/v1"), "team-a")])
        source.listed(("aifeatures", "team-a"), [])
        source.listed(("aimodels", "team-b"), [])
        source.changed(("aimodels", "team-a"), "MODIFIED", in_namespace(aimodel("m", "http://n/v1"), "team-a"))
        assert source.builder.builds == 0  # nothing was even asked to build
        assert not published.tables
        source.listed(("aifeatures", "team-b"), [])
        await until("the table", lambda: published.tables)
        assert route_in(published.latest, "team-a/m").backends[0].ready
    finally:
        await source.stop()


# -- the per-table work on the loop: only what changed ----------------------------------------------------


def weight_series(metrics: GatewayMetrics) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["namespace"], s.labels["feature"], s.labels["model"]): s.value
        for family in metrics.registry.collect()
        if family.name == contract.WEIGHT
        for s in family.samples
    }


async def test_a_weight_change_at_a_thousand_of_each_rewrites_only_its_features_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    features, models = many(1000)
    metrics = GatewayMetrics()
    touched: list[tuple[str, ...]] = []
    labels = metrics.weight.labels

    def counted(*values: str) -> Any:
        touched.append(values)
        return labels(*values)

    monkeypatch.setattr(metrics.weight, "labels", counted)
    source = KubeRouteSource()
    published = Published()
    seconds: list[float] = []

    def on_table(table: RouteTable) -> None:  # what the gateway's on_table does with the metrics, timed
        published(table)
        started = time.perf_counter()
        metrics.set_weights(table)
        seconds.append(time.perf_counter() - started)

    source.start_building(on_table)
    try:
        await asyncio.to_thread(source.listed, FEATURES, features)
        await asyncio.to_thread(source.listed, MODELS, models)
        await until("the first table", lambda: published.tables)
        assert len(weight_series(metrics)) == 1000
        touched.clear()

        # One feature becomes a canary of two models: its two series, and no other feature's.
        target = features[7]
        namespace = target["metadata"]["namespace"]
        source.changed(FEATURES, "MODIFIED", aifeature("f7", [("m7", 90), ("m57", 10)], namespace=namespace))
        with LoopLag() as lag:
            await until("the canary", lambda: len(route_in(published.latest, f"{namespace}/f7").backends) == 2)
        assert sorted(touched) == [(namespace, "f7", "m57")] or sorted(touched) == sorted(
            [(namespace, "f7", "m7"), (namespace, "f7", "m57")]
        ), touched
        series = weight_series(metrics)
        assert series[(namespace, "f7", "m7")] == 90
        assert series[(namespace, "f7", "m57")] == 10
        assert len(series) == 1001

        # The feature goes: its series go with it, nobody else's are touched.
        touched.clear()
        source.changed(FEATURES, "DELETED", target)
        await until("the deletion", lambda: f"{namespace}/f7" not in published.latest.routes)
        assert {t[:2] for t in touched} == {(namespace, "f7")}
        assert not any(key[:2] == (namespace, "f7") for key in weight_series(metrics))
        assert len(weight_series(metrics)) == 999
    finally:
        await source.stop()
    # Rewriting every series took ~60 ms a table at this size (the first table still costs that once);
    # touching only the changed ones costs a few ms. Generous for a loaded 2-core machine.
    assert max(seconds[1:]) < 0.02, seconds
    assert max(lag.lags) < 0.1, max(lag.lags)


def request_series(metrics: GatewayMetrics) -> set[tuple[str, str, str, str]]:
    """(namespace, feature, model, code) of every request counter series a scrape would show."""
    return {
        (s.labels["namespace"], s.labels["feature"], s.labels["model"], s.labels["code"])
        for family in metrics.registry.collect()
        if family.name + "_total" == contract.REQUESTS or family.name == contract.REQUESTS
        for s in family.samples
        if s.name == contract.REQUESTS
    }


def test_a_split_features_series_start_at_0_and_a_single_models_come_with_its_requests() -> None:
    """Prometheus' increase() misses a series' first sample: a canary's models' request series must exist
    (at 0) before its first request. Started for every feature, 1,000 features made ~45,000 lines per scrape."""
    features, models = many(1000)
    table = build_route_table(*parse_objects(flatten_documents([*models, *features])))
    metrics = GatewayMetrics()
    metrics.set_weights(table)
    assert request_series(metrics) == set()  # no split, no request: nothing to scrape but the weights
    namespace = features[7]["metadata"]["namespace"]
    features[7] = aifeature("f7", [("m7", 90), ("m57", 10)], namespace=namespace)
    metrics.set_weights(build_route_table(*parse_objects(flatten_documents([*models, *features]))))
    started = request_series(metrics)
    assert {(namespace, "f7", "m7", "200"), (namespace, "f7", "m57", "200"), (namespace, "f7", "m57", "429")} <= started
    assert {series[:3] for series in started} == {(namespace, "f7", "m7"), (namespace, "f7", "m57")}
    metrics.record(namespace, "f3", "m3", 200, 0.01)
    assert (namespace, "f3", "m3", "200") in request_series(metrics)
