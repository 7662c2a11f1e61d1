"""The gateway image: lean (no torch), starts as uid 10001 under a read-only root with a routes file (as a
mounted ConfigMap would be), answers /health and /ready, and lists the routed model on /v1/models."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.gateway.gateway_harness import aimodel
from tests.images.harness import Container, built_image, python_in
from tests.runtime.servers import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def gateway_image() -> str:
    return built_image("gateway")


def test_no_ml_libraries(gateway_image: str) -> None:
    code = "import importlib.util as u; print([m for m in ('torch', 'transformers', 'vllm') if u.find_spec(m)])"
    assert python_in(gateway_image, code).strip() == "[]"


def test_starts_with_a_routes_file_and_answers_health(gateway_image: str, tmp_path: Path) -> None:
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps([aimodel("m1", "http://127.0.0.1:9", served="tiny")]))
    routes.chmod(0o644)
    port = free_port()
    options = [
        "--read-only",
        "--mount=type=tmpfs,destination=/tmp,tmpfs-mode=1777",  # the chart's emptyDir
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--mount",
        f"type=bind,source={routes},destination=/etc/servlane/routes.json,readonly",
        "--publish",
        f"127.0.0.1:{port}:8080",
    ]
    with Container(gateway_image, options, ["--routes-file", "/etc/servlane/routes.json"]) as gateway:
        gateway.wait_http_ok(f"http://127.0.0.1:{port}/health", 60, "the gateway's /health")
        gateway.wait_http_ok(f"http://127.0.0.1:{port}/ready", 30, "the gateway's /ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            models = [m["id"] for m in json.load(response)["data"]]
        assert "tiny" in models, gateway.logs()
