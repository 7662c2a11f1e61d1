"""The pure parts of routing: the route table from API objects, weighted sticky picking, the watch store."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from servlane_core.routing.picking import bucket_of, effective_weights, pick_backend
from servlane_core.routing.routes import (
    Backend,
    Route,
    RouteTable,
    build_route_table,
    describe_ambiguity,
    describe_refused,
)
from servlane_gateway.routing.kube_watch import RouteObjectStore
from servlane_gateway.routing.sources import (
    flatten_documents,
    load_routes_file,
    parse_objects,
    parse_objects_reusing,
)
from tests.support.gateway_harness import aifeature, aimodel, picked, route_in


def table_of(*objects: dict[str, Any], serving: tuple[str, ...] = ("default",)) -> RouteTable:
    return build_route_table(*parse_objects(flatten_documents(objects)), serving)


def test_feature_routes_follow_status_weights_and_rewrite_to_served_names() -> None:
    table = table_of(
        aimodel("chat-v1", "http://v1:8000/", served="org.chat"),
        aimodel("chat-v2", "http://v2:8000"),
        aifeature("chat", [("chat-v1", 90), ("chat-v2", 10)]),
    )
    route = route_in(table, "chat")
    assert route is not None
    assert route.is_feature
    assert [(b.model, b.weight, b.base_url, b.served_model_name) for b in route.backends] == [
        ("chat-v1", 90, "http://v1:8000", "org.chat"),
        ("chat-v2", 10, "http://v2:8000", "chat-v2"),
    ]
    assert table.lookup("default/chat") is route
    direct = table.lookup("org.chat")
    assert direct is not None
    assert not direct.is_feature
    assert table.lookup("default/org.chat") is direct
    assert direct.backends[0].model == "chat-v1"
    assert table.names() == ["chat", "chat-v2", "org.chat"]


def test_spec_stands_in_until_the_operator_writes_weights() -> None:
    feature = aifeature("chat", [("chat-v1", 100)])
    feature["status"] = {}
    route = route_in(table_of(aimodel("chat-v1", "http://v1"), feature), "chat")
    assert route is not None
    assert [(b.model, b.weight) for b in route.backends] == [("chat-v1", 100)]


def test_not_ready_missing_endpoint_and_missing_model_get_no_traffic() -> None:
    table = table_of(
        aimodel("up", "http://up"),
        aimodel("down", "http://down", ready=False),
        aimodel("no-endpoint", None),
        aifeature("f", [("up", 40), ("down", 30), ("no-endpoint", 20), ("gone", 10)]),
    )
    route = route_in(table, "f")
    assert route is not None
    assert {b.model: b.ready for b in route.backends} == {
        "up": True,
        "down": False,
        "no-endpoint": False,
        "gone": False,
    }
    assert effective_weights(route) == {"up": 100.0, "down": 0.0, "no-endpoint": 0.0, "gone": 0.0}
    assert all(picked(route, f"id-{i}") == "up" for i in range(50))


def test_no_ready_backend_picks_none() -> None:
    route = route_in(table_of(aimodel("down", "http://down", ready=False), aifeature("f", [("down", 100)])), "f")
    assert route is not None
    assert pick_backend(route, "id") is None
    assert pick_backend(route) is None


def test_features_win_name_clashes_and_invalid_objects_are_skipped() -> None:
    bad = aifeature("broken", [("a", 100)])
    bad["spec"] = {"model": "a", "split": [{"model": "a", "weight": 100}]}  # both set: invalid
    table = table_of(
        aimodel("m", "http://m", served="chat"), aimodel("n", "http://n"), aifeature("chat", [("n", 100)]), bad
    )
    route = route_in(table, "chat")
    assert route is not None
    assert route.is_feature
    assert route.backends[0].model == "n"
    assert table.lookup("broken") is None


def test_list_documents_are_flattened() -> None:
    doc = {"kind": "List", "items": [aimodel("m", "http://m"), aifeature("f", [("m", 100)])]}
    assert table_of(doc).lookup("f") is not None


def _route(weights: dict[str, int], ready: set[str] | None = None) -> Route:
    objects = [aimodel(m, f"http://{m}", ready=ready is None or m in ready) for m in weights]
    return route_in(table_of(*objects, aifeature("f", list(weights.items()))), "f")


def test_yaml_routes_file_with_several_documents(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    docs = [aimodel("m", "http://m"), {"kind": "List", "items": [aifeature("f", [("m", 100)])]}]
    path.write_text(yaml.safe_dump_all(docs))
    assert route_in(load_routes_file(path), "default/f").backends[0].base_url == "http://m"


def _model(backend: Backend | None) -> str:
    assert backend is not None
    return backend.model


@pytest.mark.parametrize("weights", [{"stable": 95, "canary": 5}, {"a": 50, "b": 50}, {"a": 25, "b": 25, "c": 50}])
def test_sticky_ids_spread_by_weight(weights: dict[str, int]) -> None:
    route = _route(weights)
    counts = Counter(picked(route, f"user-{i}") for i in range(20_000))
    for model, weight in weights.items():
        assert counts[model] / 20_000 == pytest.approx(weight / 100, abs=0.015)


def test_unsticky_picks_spread_by_weight() -> None:
    route = _route({"stable": 80, "canary": 20})
    rng = random.Random(7)
    counts = Counter(_model(pick_backend(route, None, rng=rng)) for _ in range(20_000))
    assert counts["canary"] / 20_000 == pytest.approx(0.2, abs=0.015)


def test_same_id_same_version_and_canary_growth_keeps_its_ids() -> None:
    ids = [f"req-{i}" for i in range(2000)]
    at_5 = {i: picked(_route({"stable": 95, "canary": 5}), i) for i in ids}
    again = {i: picked(_route({"stable": 95, "canary": 5}), i) for i in ids}
    assert at_5 == again
    at_25 = {i: picked(_route({"stable": 75, "canary": 25}), i) for i in ids}
    # Buckets are laid out along the weights, so ids on the canary at 5% stay on it at 25%.
    assert all(at_25[i] == "canary" for i in ids if at_5[i] == "canary")
    assert all(0 <= bucket_of(i) < 100 for i in ids)


def test_weights_renormalise_over_ready_backends_and_exclude_skips_one() -> None:
    route = _route({"a": 50, "b": 30, "c": 20}, ready={"a", "b"})
    assert effective_weights(route) == {"a": 62.5, "b": 37.5, "c": 0.0}
    picks = {_model(pick_backend(route, f"x{i}", exclude=["a"])) for i in range(200)}
    assert picks == {"b"}


def test_a_model_a_split_names_twice_reports_both_its_shares() -> None:
    """Admitted by the API (as it always was): all the traffic goes to it, and the weights gauge must say so."""
    objects = [aimodel("a", "http://a")]
    route = route_in(table_of(*objects, aifeature("f", [("a", 50), ("a", 50)])), "f")
    assert effective_weights(route) == {"a": 100.0}
    assert {_model(pick_backend(route, f"x{i}")) for i in range(50)} == {"a"}


def test_object_store_applies_watch_events() -> None:
    streams = [("aifeatures", ""), ("aimodels", "")]
    store = RouteObjectStore(streams)
    store.replace(("aimodels", ""), [aimodel("m", "http://m"), aimodel("n", "http://n")])
    assert not store.synced  # features not listed yet: no partial table
    store.replace(("aifeatures", ""), [aifeature("f", [("m", 100)])])
    assert store.synced
    assert route_in(store.table(), "default/f").backends[0].ready
    assert store.apply(("aimodels", ""), "MODIFIED", aimodel("m", "http://m", ready=False))
    assert not route_in(store.table(), "default/f").backends[0].ready
    store.apply(("aifeatures", ""), "MODIFIED", aifeature("f", [("n", 100)]))
    assert route_in(store.table(), "default/f").backends[0].model == "n"
    assert store.apply(("aimodels", ""), "DELETED", aimodel("n", "http://n"))
    assert not store.apply(("aimodels", ""), "BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert store.table().lookup("default/n") is None
    assert store.table().lookup("f") is None  # plain names come from the serving namespaces, set by the app


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "namespace": namespace}}


SEVERAL = (
    in_namespace(aimodel("v1", "http://v1"), "team-b"),
    aifeature("chat", [("v1", 100)], namespace="team-b"),
    aifeature("chat", [("v1", 100)], namespace="team-a"),
    aifeature("chat", [("v1", 100)], namespace="team-c"),
    aifeature("search", [("v1", 100)], namespace="team-c"),
)


def test_a_plain_name_several_serving_namespaces_hold_is_ambiguous_whatever_their_order() -> None:
    """No namespace wins a plain name by its place in the list: a new object never takes over traffic."""
    for serving in (("team-c", "team-b"), ("team-b", "team-c")):
        table = table_of(*SEVERAL, serving=serving)
        assert table.lookup("chat") is None
        assert table.ambiguous == {"chat": serving}  # team-a is not serving: not a holder
        assert route_in(table, "search").namespace == "team-c"
        assert route_in(table, "v1").namespace == "team-b"
        (line,) = describe_ambiguity(table)
        assert f"'{serving[0]}', '{serving[1]}'" in line
        assert "refused as ambiguous" in line
        assert "team-a" not in line
        assert table.names() == ["search", "v1", "team-a/chat", "team-b/chat", "team-c/chat"]


def test_outside_the_serving_namespaces_only_namespace_slash_name_works() -> None:
    table = table_of(*SEVERAL, serving=("team-b",))
    assert route_in(table, "chat").namespace == "team-b"
    assert table.lookup("search") is None  # only team-c holds it, and team-c is not serving
    for namespace in ("team-a", "team-b", "team-c"):
        assert route_in(table, f"{namespace}/chat").namespace == namespace
    assert route_in(table, "team-c/search").namespace == "team-c"
    assert table.ambiguous == {}
    assert table_of(*SEVERAL, serving=()).lookup("chat") is None


def test_a_served_name_with_a_slash_is_refused_and_cannot_shadow_namespace_slash_name() -> None:
    table = table_of(
        aifeature("chat", [("v1", 100)], namespace="prod"),
        in_namespace(aimodel("v1", "http://v1:8000"), "prod"),
        # An AIModel elsewhere whose served name reads like prod's feature: it must not take it over.
        # The API refuses '/' in spec.servedModelName; the route table still refuses one in the status.
        in_namespace(aimodel("impostor", "http://evil", status_served="prod/chat"), "attacker"),
        in_namespace(aimodel("hf", "http://hf", status_served="meta-llama/Llama-3"), "prod"),
        serving=("attacker", "prod"),
    )
    assert route_in(table, "prod/chat").backends[0].base_url == "http://v1:8000"
    assert route_in(table, "chat").namespace == "prod"
    assert table.lookup("attacker/prod/chat") is None
    assert table.lookup("meta-llama/Llama-3") is None
    assert table.refused == ("attacker/impostor", "prod/hf")
    lines = describe_refused(table)
    assert len(lines) == 2
    assert "'attacker/impostor'" in lines[0]
    assert table.names() == ["chat", "v1"]


def test_a_slash_in_spec_served_name_is_invalid_and_the_gateway_leaves_the_aimodel_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Admission refuses it (CEL); an object stored before the rule existed is logged and skipped, never routed."""
    with caplog.at_level("WARNING", logger="servlane_gateway.routing.sources"):
        table = table_of(aimodel("hf", "http://hf", served="meta-llama/Llama-3"), aimodel("ok", "http://ok"))
    assert table.names() == ["ok"]
    assert any("'hf'" in r.getMessage() and "must not contain '/'" in r.getMessage() for r in caplog.records)


def test_a_reload_parses_only_the_objects_that_changed_and_gives_what_a_full_parse_gives() -> None:
    first_raw = [
        aimodel("v1", "http://v1:8000/v1"),
        aimodel("v2", "http://v2:8000/v1"),
        aifeature("chat", [("v1", 100)]),
    ]
    _, models, known = parse_objects_reusing(first_raw, {})
    assert [m.model_dump() for m in models] == [m.model_dump() for m in parse_objects(first_raw)[1]]
    second_raw = [
        aimodel("v1", "http://v1:8000/v1"),
        aimodel("v2", "http://v2:9000/v1"),
        aifeature("chat", [("v2", 100)]),
    ]
    features2, models2, _ = parse_objects_reusing(second_raw, known)
    assert models2[0] is models[0]  # unchanged: the earlier object
    assert models2[1] is not models[1]
    assert models2[1].status.endpoint == "http://v2:9000/v1"
    assert features2[0].status.weights[0].model == "v2"
    expected = parse_objects(second_raw)
    assert [o.model_dump() for o in features2 + models2] == [o.model_dump() for o in expected[0] + expected[1]]


def test_a_value_equal_in_python_but_not_in_the_manifest_is_parsed_again() -> None:
    """1 == True in Python, but `true` is not what a manifest that said 1 said: whatever validation makes of it
    (here the same count), it must be its own parse, not the earlier object."""
    counted = aimodel("v1", "http://v1:8000/v1")
    counted["spec"]["replicas"] = 1
    _, models, known = parse_objects_reusing([counted], {})
    assert models[0].spec.replicas == 1
    flagged = aimodel("v1", "http://v1:8000/v1")
    flagged["spec"]["replicas"] = True
    _, again, _ = parse_objects_reusing([flagged], known)
    assert again == parse_objects([flagged])[1]  # whatever a fresh parse makes of it, not the earlier object
    assert again[0] is not models[0]


def test_invalid_objects_are_reported_on_every_reload_and_yaml_dates_do_not_break_reuse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = aimodel("bad", None)
    broken["spec"]["engine"] = "nope"
    dated = aimodel("dated", "http://d:8000/v1")
    dated["metadata"]["creationTimestamp"] = yaml.safe_load("t: 2026-12-06T10:00:00Z")["t"]  # a datetime
    _, models, known = parse_objects_reusing([broken, dated], {})
    _, again, _ = parse_objects_reusing([broken, dated], known)
    assert [m.name for m in models] == [m.name for m in again] == ["dated"]
    assert sum("ignoring" in r.getMessage() for r in caplog.records) == 2
