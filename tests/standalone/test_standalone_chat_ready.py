"""`servlane chat` waits until the gateway routes the feature (or model), not only until its model has loaded.

The state file says Ready as soon as the runtime answers /ready; the gateway sees it at its next reload of the
routes file. Here the gateway reloads only every few seconds (as a slow disk or a busy machine would make it)
and holds no request for a model that is still starting, so a chat started while the model loads and sent as
soon as the state file says Ready would get 503 "No backend of 'chat' is ready". The chat must wait for the
gateway's own route table instead: a feature's weight, a model's phase in the table's objects.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from servlane_api.aifeature import AIFeatureStatus
from servlane_cli import chat_cmd
from servlane_cli.chat_cmd import (
    NO_CONSOLE,
    GatewayModels,
    NoConsole,
    RouteWeights,
    gateway_models,
    route_weights,
    wait_until_served,
)
from servlane_cli.state import FeatureState, GatewayProcessState, ModelState, SupervisorState
from servlane_cli.status_cmd import render_status
from tests.standalone.standalone_harness import Serve, ai_feature, ai_model, write_manifests

# Longer than the state file's lag behind a load (a tick) by far, shorter than the harness's routing wait.
SLOW_RELOAD_SECONDS = "5"

METRICS = """\
# HELP servlane_gateway_route_weight Percent of a feature's traffic each model gets now (after readiness).
# TYPE servlane_gateway_route_weight gauge
servlane_gateway_route_weight{feature="chat",model="tiny-chat",namespace="default"} 0.0
servlane_gateway_route_weight{feature="chat",model="tiny-chat",namespace="team-b"} 100.0
servlane_gateway_route_weight{feature="embeddings",model="minilm",namespace="default"} 100.0
"""


def _state(phase: str, namespace: str = "default", features: bool = True) -> SupervisorState:
    model = ModelState(
        name="tiny-chat", served_model_name="tiny-chat", engine="transformers", task="chat", phase=phase,
        port=1, endpoint="http://127.0.0.1:1/v1", log_file="x.log",
    )  # fmt: skip
    feature = FeatureState(name="chat", namespace=namespace, target="tiny-chat", generation=1, status=AIFeatureStatus())
    gateway = GatewayProcessState(url="http://127.0.0.1:2", metrics_url="http://127.0.0.1:3/metrics", log_file="g.log")
    return SupervisorState(
        supervisor_pid=os.getpid(), running=True, inputs=[], updated_at="", gateway=gateway,
        models=[model], features=[feature] if features else [],
    )  # fmt: skip


def test_route_weights_are_per_namespace_and_feature() -> None:
    assert route_weights(METRICS) == {
        ("default", "chat"): 0.0,
        ("team-b", "chat"): 100.0,
        ("default", "embeddings"): 100.0,
    }


def test_a_loaded_model_is_not_ready_until_the_gateway_routes_its_feature() -> None:
    answers: list[RouteWeights | None] = [None, {("default", "chat"): 0.0}, {("default", "chat"): 100.0}]
    asked: list[str] = []

    def weights(url: str) -> RouteWeights | None:
        asked.append(url)
        return answers[min(len(asked) - 1, len(answers) - 1)]

    out = io.StringIO()
    problem = wait_until_served(lambda: _state("Ready"), "chat", timeout=30, out=out, read_weights=weights)
    assert problem is None
    assert len(asked) == 3, "ready before the gateway gave the feature weight"
    assert asked[0] == "http://127.0.0.1:3/metrics"  # the metrics port, not the API's
    assert "waiting for the gateway" in out.getvalue()


def test_another_namespaces_weight_does_not_make_a_feature_ready() -> None:
    """Team B's feature of the same name carries weight; ours does not: still not ready."""
    problem = wait_until_served(
        lambda: _state("Ready"), "chat", timeout=1, out=io.StringIO(), read_weights=lambda _url: route_weights(METRICS)
    )
    assert problem is not None
    assert "not ready" in problem


def test_a_loaded_model_called_by_its_name_is_not_ready_until_the_gateways_table_has_it_ready() -> None:
    """No feature: the weights gauge says nothing about the model, the gateway's own objects do."""
    answers: list[GatewayModels | None] = [None, {}, {"tiny-chat": {"Deploying"}}, {"tiny-chat": {"Ready"}}]
    asked: list[str] = []

    def models(url: str) -> GatewayModels | NoConsole | None:
        asked.append(url)
        return answers[min(len(asked) - 1, len(answers) - 1)]

    out = io.StringIO()
    problem = wait_until_served(
        lambda: _state("Ready", features=False), "tiny-chat", timeout=30, out=out,
        read_weights=lambda _url: {}, read_models=models,
    )  # fmt: skip
    assert problem is None
    assert len(asked) == 4, "ready before the gateway's route table had the model ready"
    assert asked[0] == "http://127.0.0.1:2"  # the gateway's API port, where its console answers
    assert "waiting for the gateway" in out.getvalue()


def test_a_model_name_never_ready_in_the_gateway_is_not_ready() -> None:
    problem = wait_until_served(
        lambda: _state("Ready", features=False), "tiny-chat", timeout=1, out=io.StringIO(),
        read_weights=lambda _url: {}, read_models=lambda _url: {"tiny-chat": {"Failed"}, "other": {"Ready"}},
    )  # fmt: skip
    assert problem is not None
    assert "not ready" in problem


def test_without_the_gateways_console_a_model_name_is_routable_once_the_gateway_answers() -> None:
    asked: list[str] = []

    def weights(url: str) -> RouteWeights | None:
        asked.append(url)
        return None if len(asked) < 2 else {}

    problem = wait_until_served(
        lambda: _state("Ready", features=False), "tiny-chat", timeout=30, out=io.StringIO(),
        read_weights=weights, read_models=lambda _url: NO_CONSOLE,
    )  # fmt: skip
    assert problem is None
    assert len(asked) == 2


def test_gateway_models_reads_the_consoles_models() -> None:
    state = {
        "features": [{"name": "chat", "phase": "Stable"}],
        "models": [
            {"namespace": "default", "name": "tiny-chat", "phase": "Ready"},
            {"namespace": "team-b", "name": "tiny-chat", "phase": "Deploying"},
            {"namespace": "default", "name": "minilm", "phase": None},
            {"phase": "Ready"},
        ],
    }
    assert gateway_models(state) == {"tiny-chat": {"Ready", "Deploying"}, "minilm": {"None"}}
    assert gateway_models([]) == {}
    assert gateway_models({"models": "x"}) == {}


@pytest.fixture(scope="module")
def slow_reloading(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    root = tmp_path_factory.mktemp("chat-ready")
    (root / "manifests").mkdir()
    write_manifests(root / "manifests" / "models.yaml", [ai_model("tiny-chat", str(tiny_llama_dir))])
    write_manifests(root / "manifests" / "features.yaml", [ai_feature("chat", "tiny-chat")])
    # No request held for a starting model either: a request before the gateway's table has it ready is a 503.
    env = {"SERVLANE_GATEWAY_RELOAD_POLL_SECONDS": SLOW_RELOAD_SECONDS, "SERVLANE_GATEWAY_HOLD_MAX_PER_MODEL": "0"}
    serve = Serve(root / "manifests", root / "state", env=env)
    try:
        yield serve
    finally:
        serve.kill_everything()


@pytest.mark.slow
def test_chat_started_while_loading_gets_an_answer_not_503(slow_reloading: Serve) -> None:
    """Both started while the model loads: by the feature's name, and by the model's own."""
    early_chats = {
        name: slow_reloading.cli_background("chat", name, "--message", "Hello", "--max-tokens", "3")
        for name in ("chat", "tiny-chat")
    }
    for name, early_chat in early_chats.items():
        try:
            _, stderr = early_chat.communicate(timeout=300)
        finally:
            early_chat.kill()
        assert "No backend" not in stderr, f"{name}: {stderr}\n{slow_reloading.log()[-3000:]}"
        assert early_chat.returncode == 0, f"{name}: {stderr}\n{slow_reloading.log()[-3000:]}"
        assert f"waiting for {name}" in stderr, stderr


def test_a_feature_whose_model_no_manifest_defines_is_said_at_once() -> None:
    """It waited the whole timeout (600 s by default) saying "waiting for its models"."""
    state = _state("Starting")
    state.features[0].target = "no-such-model"
    said = wait_until_served(lambda: state, "chat", timeout=60, out=io.StringIO(), read_weights=lambda _: None)
    assert said == "chat routes to no-such-model, which no AIModel of these manifests defines"


def test_a_feature_served_by_an_adapter_waits_for_its_models_pods() -> None:
    """An adapter target (tiny-chat:sql) is served by its AIModel: it was looked up as a model of its own."""
    state = _state("Ready")
    state.features[0].target = "tiny-chat:sql"
    weights = {("default", "chat"): 100.0}
    assert (
        wait_until_served(lambda: state, "chat", timeout=5, out=io.StringIO(), read_weights=lambda _: weights) is None
    )


def test_waiting_for_a_serve_that_has_not_written_its_state_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """It said nothing for the whole grace (30 s) and then that nothing runs."""
    monkeypatch.setattr(chat_cmd, "STARTUP_GRACE_SECONDS", 1.0)
    shown = io.StringIO()
    said = wait_until_served(lambda: None, "chat", timeout=60, out=shown)
    assert said == "`servlane serve` is not running for these manifests"
    assert shown.getvalue() == "waiting up to 1s for `servlane serve` to start\n"


@pytest.mark.parametrize(("applied", "said"), [(False, "nothing applied"), (True, "previous manifests still applied")])
def test_status_says_whether_a_manifest_error_left_anything_running(applied: bool, said: str) -> None:
    """After a first load that failed it said the previous manifests were still applied: there were none."""
    state = _state("Ready").model_copy(update={"manifest_error": "m.yaml: bad", "manifests_applied": applied})
    assert f"manifest error ({said}): m.yaml: bad" in render_status(state)
