"""LoRA adapters in the pure parts: targets, the runtime's adapter list and plan, the adapter switch of the
transformers engine, the operator's ConfigMap and volumes, and the gateway's routes."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from servlane_api import AIFeature
from servlane_api.runtime_config import ADAPTERS_FILE
from servlane_api.runtime_contract import build_runtime_config
from servlane_api.targets import Target, parse_target
from servlane_core.routing.routes import build_route_table
from servlane_operator.aifeature_reconciler import own_replicas, target_ready
from servlane_operator.builders import build_deployment, plan_children
from servlane_operator.builders.adapters import build_adapters_config_map
from servlane_operator.settings import OperatorSettings
from servlane_runtime.adapters import AdaptersFileError, parse_adapters, plan_changes
from tests.support.aimodels import make_model

READY: dict[str, Any] = {
    "conditions": [{"type": "Ready", "status": "True", "reason": "Test"}],
    "endpoint": "http://llama:8000/v1",
}


def adapters(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "source": source} for name, source in pairs]


def spec(**fields: Any) -> dict[str, Any]:
    return {"source": {"uri": "/models/base"}, "engine": "vllm", **fields}


# ---- targets --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "target"),
    [("llama", Target("llama")), ("llama:sql-v2", Target("llama", "sql-v2")), ("llama:a.b", Target("llama", "a.b"))],
)
def test_a_target_is_a_model_and_maybe_an_adapter(text: str, target: Target) -> None:
    assert parse_target(text) == target
    assert str(target) == text


# ---- the runtime's list and plan ----------------------------------------------------------------------


def test_the_adapters_file_is_read_strictly() -> None:
    assert parse_adapters("") == {}
    assert parse_adapters(json.dumps(adapters(("a", "/a"), ("b", "hf://o/b")))) == {"a": "/a", "b": "hf://o/b"}
    for bad in ("{", '{"a": "/a"}', '[{"name": "a"}]', json.dumps(adapters(("a", "/a"), ("a", "/b")))):
        with pytest.raises(AdaptersFileError):
            parse_adapters(bad)


def test_the_plan_loads_new_unloads_removed_and_reloads_moved_adapters() -> None:
    changes = plan_changes({"keep": "/k", "gone": "/g", "moved": "/old"}, {"keep": "/k", "moved": "/new", "new": "/n"})
    assert changes.unload == ("gone", "moved")
    assert changes.load == (("moved", "/new"), ("new", "/n"))
    assert plan_changes({"a": "/a"}, {"a": "/a"}) == plan_changes({}, {})


# ---- the transformers engine's adapter switch --------------------------------------------------------


def test_the_switch_never_runs_two_adapters_at_once_and_starves_none() -> None:
    pytest.importorskip("torch")
    from servlane_runtime.engines.adapter_switch import AdapterSwitch

    activations: list[str | None] = []
    running: dict[str | None, int] = {}
    overlaps: list[set[str | None]] = []
    lock = threading.Lock()
    switch = AdapterSwitch(activations.append)

    def steps(name: str | None, count: int) -> None:
        for _ in range(count):
            with switch.step(name):
                with lock:
                    running[name] = running.get(name, 0) + 1
                    active = {n for n, c in running.items() if c}
                    if len(active) > 1:
                        overlaps.append(active)
                with lock:
                    running[name] -= 1

    threads = [threading.Thread(target=steps, args=(n, 200)) for n in (None, None, "a", "a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a step waited forever"
    assert overlaps == []
    assert {"a", "b"} <= set(activations)  # the base model is active to begin with
    assert all(x != y for x, y in itertools.pairwise(activations)), "switched to the adapter already active"


# ---- the operator --------------------------------------------------------------------------------------


def test_adapters_go_into_a_config_map_not_the_pod_template(settings: OperatorSettings) -> None:
    one = make_model(spec(adapters=adapters(("sql", "hf://org/sql-lora"), ("chat", "pvc://loras/chat/v1"))))
    config_map = build_adapters_config_map(one)
    assert config_map is not None
    assert config_map["metadata"]["name"] == "model-llama"
    listed = json.loads(config_map["data"]["adapters.json"])
    assert listed == adapters(("sql", "hf://org/sql-lora"), ("chat", "/mnt/adapters/loras/chat/v1"))
    config = build_runtime_config(one)
    assert (config.adapters_enabled, config.adapters_file, config.max_adapters) == (True, ADAPTERS_FILE, 4)

    # Another adapter, from the same claim or the Hub: a new list, the same pods.
    more = make_model(spec(adapters=[*adapters(("sql", "hf://o/s")), *adapters(("x", "pvc://loras/x"))]))
    assert build_deployment(more, settings)["spec"]["template"] == build_deployment(one, settings)["spec"]["template"]
    assert build_adapters_config_map(more) != config_map
    # A new claim is a new volume: the template changes.
    other_claim = make_model(spec(adapters=adapters(("sql", "pvc://other/s"))))
    assert (
        build_deployment(other_claim, settings)["spec"]["template"]
        != build_deployment(one, settings)["spec"]["template"]
    )
    volumes = build_deployment(other_claim, settings)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "adapters", "configMap": {"name": "model-llama"}} in volumes


def test_without_adapters_there_is_no_list_unless_asked_for(settings: OperatorSettings) -> None:
    plain = make_model(spec())
    assert build_adapters_config_map(plain) is None
    assert not build_runtime_config(plain).adapters_enabled
    assert "ConfigMap" not in {o["kind"] for o in plan_children(plain, settings).apply}
    # engineOptions.enableAdapters: the room is reserved, so the first adapter added later needs no restart.
    ready = make_model(spec(engineOptions={"enableAdapters": True}))
    first = make_model(spec(engineOptions={"enableAdapters": True}, adapters=adapters(("a", "/a"))))
    assert build_runtime_config(ready).adapters_enabled
    assert "ConfigMap" in {o["kind"] for o in plan_children(ready, settings).apply}
    assert (
        build_deployment(ready, settings)["spec"]["template"] == build_deployment(first, settings)["spec"]["template"]
    )


def test_an_adapter_target_is_ready_with_its_model_while_listed() -> None:
    body = {"spec": spec(adapters=adapters(("v1", "/a"))), "status": READY}
    assert target_ready("llama:v1", body)
    assert not target_ready("llama:v2", body)  # not (or no longer) in the model's spec
    assert not target_ready("llama:v1", {**body, "status": {}})
    assert own_replicas({"llama": body, "llama:v1": body}) == {"llama": 1}  # adapters share the model's pods


# ---- the gateway's routes ------------------------------------------------------------------------------


def feature(target: str, weights: list[tuple[str, int]]) -> AIFeature:
    return AIFeature.model_validate(
        {
            "apiVersion": "servlane.dev/v1alpha1",
            "kind": "AIFeature",
            "metadata": {"name": "assist", "namespace": "team-a"},
            "spec": {"model": target},
            "status": {"weights": [{"model": m, "weight": w} for m, w in weights]},
        }
    )


def test_adapters_are_routed_by_name_and_as_feature_targets() -> None:
    model = make_model(spec(adapters=adapters(("v1", "/a"), ("v2", "/b"), ("llama", "/c"))), **READY)
    table = build_route_table([feature("llama:v2", [("llama:v1", 50), ("llama:v2", 50)])], [model], ["team-a"])

    direct = table.lookup("v1")
    assert direct is not None
    assert [(b.model, b.served_model_name, b.ready) for b in direct.backends] == [("llama:v1", "v1", True)]
    assert direct.backends[0].base_url == "http://llama:8000"
    base = table.lookup("llama")  # the served name wins over an adapter of the same name
    assert base is not None
    assert [(b.model, b.served_model_name) for b in base.backends] == [("llama", "llama")]

    routed = table.lookup("assist")
    assert routed is not None
    assert [(b.model, b.served_model_name, b.weight) for b in routed.backends] == [
        ("llama:v1", "v1", 50),
        ("llama:v2", "v2", 50),
    ]
    assert routed.backends[0].version != routed.backends[1].version  # the response cache keeps them apart

    # An adapter removed from the model's spec: its weight stays visible, but it gets no traffic.
    fewer = make_model(spec(adapters=adapters(("v1", "/a"))), **READY)
    table = build_route_table([feature("llama:v2", [("llama:v1", 50), ("llama:v2", 50)])], [fewer], ["team-a"])
    routed = table.lookup("assist")
    assert routed is not None
    assert [b.ready for b in routed.backends] == [True, False]
    assert table.lookup("v2") is None


def test_loading_an_adapter_waits_for_the_running_steps_and_holds_new_ones() -> None:
    pytest.importorskip("torch")
    from servlane_runtime.engines.adapter_switch import AdapterSwitch

    switch = AdapterSwitch(lambda _name: None)
    in_step, release, exclusive_done, later_step_ran = (threading.Event() for _ in range(4))
    order: list[str] = []

    def long_step() -> None:
        with switch.step("a"):
            in_step.set()
            release.wait(10)
            order.append("step")

    def load() -> None:
        with switch.exclusive():
            order.append("exclusive")
        exclusive_done.set()

    def later_step() -> None:
        with switch.step(None):
            order.append("later")
        later_step_ran.set()

    first = threading.Thread(target=long_step)
    first.start()
    assert in_step.wait(10)
    loader = threading.Thread(target=load)
    loader.start()
    assert not exclusive_done.wait(0.2)  # the model must not change under a running step
    release.set()
    assert exclusive_done.wait(10)
    threading.Thread(target=later_step).start()
    assert later_step_ran.wait(10)
    first.join(10)
    loader.join(10)
    assert order == ["step", "exclusive", "later"]
