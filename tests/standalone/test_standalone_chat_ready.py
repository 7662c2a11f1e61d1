"""`servlane chat` waits until the gateway routes the feature, not only until its model has loaded.

The state file says Ready as soon as the runtime answers /ready; the gateway sees it at its next reload of the
routes file. Here the gateway reloads only every few seconds (as a slow disk or a busy machine would make it),
so a chat started while the model loads and sent as soon as the state file says Ready would get 503 "No backend
of 'chat' is ready". The chat must wait for the gateway's own route table instead.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from servlane_api.aifeature import AIFeatureStatus
from servlane_cli.chat_cmd import RouteWeights, route_weights, wait_until_served
from servlane_cli.state import FeatureState, GatewayProcessState, ModelState, SupervisorState
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


def _state(phase: str, namespace: str = "default") -> SupervisorState:
    model = ModelState(
        name="tiny-chat", served_model_name="tiny-chat", engine="transformers", task="chat", phase=phase,
        port=1, endpoint="http://127.0.0.1:1/v1", log_file="x.log",
    )  # fmt: skip
    feature = FeatureState(name="chat", namespace=namespace, target="tiny-chat", generation=1, status=AIFeatureStatus())
    gateway = GatewayProcessState(url="http://127.0.0.1:2", metrics_url="http://127.0.0.1:3/metrics", log_file="g.log")
    return SupervisorState(
        supervisor_pid=os.getpid(), running=True, inputs=[], updated_at="", gateway=gateway,
        models=[model], features=[feature],
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


@pytest.fixture(scope="module")
def slow_reloading(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    root = tmp_path_factory.mktemp("chat-ready")
    (root / "manifests").mkdir()
    write_manifests(root / "manifests" / "models.yaml", [ai_model("tiny-chat", str(tiny_llama_dir))])
    write_manifests(root / "manifests" / "features.yaml", [ai_feature("chat", "tiny-chat")])
    serve = Serve(root / "manifests", root / "state", env={"SERVLANE_GATEWAY_RELOAD_POLL_SECONDS": SLOW_RELOAD_SECONDS})
    try:
        yield serve
    finally:
        serve.kill_everything()


@pytest.mark.slow
def test_chat_started_while_loading_gets_an_answer_not_503(slow_reloading: Serve) -> None:
    early_chat = slow_reloading.cli_background("chat", "chat", "--message", "Hello", "--max-tokens", "3")
    try:
        _, stderr = early_chat.communicate(timeout=300)
    finally:
        early_chat.kill()
    assert "No backend" not in stderr, f"{stderr}\n{slow_reloading.log()[-3000:]}"
    assert early_chat.returncode == 0, f"{stderr}\n{slow_reloading.log()[-3000:]}"
    assert "waiting for chat" in stderr, stderr
