"""The gateway image: lean (no torch), starts as uid 10001 under a read-only root with a routes file (as a
mounted ConfigMap would be), answers /health and /ready, and lists the routed model on /v1/models.

Every documented setting's optional modules are in the image (tracing, Redis, the PostgreSQL batch store):
they are imported only when the setting is on, so the development venv's tests cannot notice one missing from
the image's extras; the gateway also starts with tracing on against an absent collector, as the chart's
`tracing.enabled` makes it."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import secrets
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.images.harness import Container, built_image, pod_run_args, python_in, unavailable
from tests.support.gateway_harness import aimodel
from tests.support.helm_toggles import RELEASE, SYSTEM, toggles_values
from tests.support.helmtool import Helm, HelmUnavailable, find_helm, one
from tests.support.ports import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def gateway_image() -> str:
    return built_image("gateway")


def test_no_ml_libraries(gateway_image: str) -> None:
    code = "import importlib.util as u; print([m for m in ('torch', 'transformers', 'vllm') if u.find_spec(m)])"
    assert python_in(gateway_image, code).strip() == "[]"


# What each setting makes the gateway import, done the way the gateway does it: tracing through
# servlane_web.tracing (the SDK and the OTLP/HTTP exporter), the shared limits and cache through redis.asyncio,
# the batch store's postgresql:// through SQLAlchemy's psycopg 3 dialect (an engine, no connection) and Alembic,
# the batch upload through python-multipart, several workers through prometheus_client's multiprocess mode.
SETTINGS_MODULES = """
import os
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
from servlane_web.tracing import start_tracing, stop_tracing
assert start_tracing("servlane-gateway") is not None
stop_tracing()
import redis.asyncio, servlane_gateway.limits.redis_limiter, servlane_gateway.cache.redis_store
import sqlalchemy, alembic.command, alembic.config
from servlane_gateway.batch.files import engine_url
engine = sqlalchemy.create_engine(engine_url("postgresql://batch@127.0.0.1:9/batch"))
assert engine.dialect.driver == "psycopg", engine.dialect.driver
import python_multipart
import prometheus_client.multiprocess
print("ok")
"""


def test_every_settings_optional_modules_are_installed(gateway_image: str) -> None:
    assert python_in(gateway_image, SETTINGS_MODULES).strip().splitlines()[-1] == "ok"


def _routes_mount(routes: Path) -> list[str]:
    """A routes file with one model, mounted read-only at /etc/servlane/routes.json (as a ConfigMap would be)."""
    routes.write_text(json.dumps([aimodel("m1", "http://127.0.0.1:9", served="tiny")]))
    routes.chmod(0o644)
    return ["--mount", f"type=bind,source={routes},destination=/etc/servlane/routes.json,readonly"]


def _run_options(routes: Path, port: int) -> list[str]:
    return [
        "--read-only",
        "--mount=type=tmpfs,destination=/tmp,tmpfs-mode=1777",  # the chart's emptyDir
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        *_routes_mount(routes),
        "--publish",
        f"127.0.0.1:{port}:8080",
    ]


def test_starts_with_tracing_on_and_no_collector(gateway_image: str, tmp_path: Path) -> None:
    """The chart's tracing.enabled environment, with the collector's address unreachable (not deployed yet):
    the gateway serves, and says tracing is on."""
    port = free_port()
    tracing = [  # as charts/servlane/templates/_helpers.tpl's servlane.tracingEnv sets it
        "--env=OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.invalid:4318",
        "--env=OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
        "--env=OTEL_TRACES_SAMPLER=parentbased_traceidratio",
        "--env=OTEL_TRACES_SAMPLER_ARG=1.0",
    ]
    options = _run_options(tmp_path / "routes.json", port) + tracing
    args = ["--routes-file", "/etc/servlane/routes.json", "--log-level", "info"]
    with Container(gateway_image, options, args) as gateway:
        gateway.wait_http_ok(f"http://127.0.0.1:{port}/health", 60, "the gateway's /health with tracing on")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            trace_id = response.headers.get("x-trace-id") or ""
        assert re.fullmatch("[0-9a-f]{32}", trace_id), f"no trace id on a traced request: {trace_id!r}"
        gateway.assert_running("serving with tracing on")
        assert "tracing on" in gateway.logs(), gateway.logs()


def test_starts_with_a_routes_file_and_answers_health(gateway_image: str, tmp_path: Path) -> None:
    port = free_port()
    options = _run_options(tmp_path / "routes.json", port)
    with Container(gateway_image, options, ["--routes-file", "/etc/servlane/routes.json"]) as gateway:
        gateway.wait_http_ok(f"http://127.0.0.1:{port}/health", 60, "the gateway's /health")
        gateway.wait_http_ok(f"http://127.0.0.1:{port}/ready", 30, "the gateway's /ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            models = [m["id"] for m in json.load(response)["data"]]
        assert "tiny" in models, gateway.logs()


def test_starts_under_the_charts_pod_spec_with_every_toggle_on(gateway_image: str, tmp_path: Path) -> None:
    """The gateway container of the chart rendered with the real-node toggle set (tracing to an absent
    collector, API keys, the console, two workers, NetworkPolicies), run with the docker flags its pod spec
    translates to (the chart's uid, read-only root, its volumes, its environment). The one change: no API
    server here, so the routes come from a file instead of --watch."""
    try:
        helm = Helm(find_helm())
    except HelmUnavailable as exc:
        unavailable(str(exc))
    key = "sk-" + secrets.token_hex(16)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(toggles_values("sha256:" + hashlib.sha256(key.encode()).hexdigest())))
    objects = helm.template(values, release=RELEASE, namespace=SYSTEM)
    deployment = copy.deepcopy(one(objects, "Deployment", f"{RELEASE}-gateway"))
    pod = deployment["spec"]["template"]["spec"]
    # The keys Secret as the kubelet projects it: a read-only directory with one file per key of the Secret.
    keys_dir = tmp_path / "api-keys"
    keys_dir.mkdir()
    secret = one(objects, "Secret", f"{RELEASE}-gateway-api-keys")
    files = {name: base64.b64decode(value) for name, value in (secret.get("data") or {}).items()}
    files |= {name: value.encode() for name, value in (secret.get("stringData") or {}).items()}
    assert files, secret
    for name, content in files.items():
        (keys_dir / name).write_bytes(content)
        (keys_dir / name).chmod(0o644)
    keys_dir.chmod(0o755)
    for volume in pod["volumes"]:
        if "secret" in volume:
            del volume["secret"]
            volume["persistentVolumeClaim"] = {"claimName": "secret-as-directory", "readOnly": True}
    (container,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    container["args"] = ["--routes-file", "/etc/servlane/routes.json"]
    port = free_port()
    run = pod_run_args(
        deployment,
        claims={"secret-as-directory": keys_dir},
        host_ports={"http": port, "metrics": free_port()},
        container_name="gateway",
    )
    assert run.image == gateway_image
    with Container(gateway_image, run.options + _routes_mount(tmp_path / "routes.json"), run.args) as gateway:
        gateway.wait_http_ok(run.probe_url("readinessProbe"), 60, "the chart's readiness probe, every toggle on")
        base = f"http://127.0.0.1:{port}"
        request = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            trace_id = response.headers.get("x-trace-id") or ""
        assert re.fullmatch("[0-9a-f]{32}", trace_id), f"no trace id with tracing on: {trace_id!r}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/v1/models", timeout=10)
        assert refused.value.code == 401
        console = urllib.request.Request(base + "/console/api/state", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(console, timeout=10) as response:
            assert response.status == 200
        # Half a request's head, and nothing more: the chart's deadline for a head (30 s) answers it with a 408.
        deadline = float(
            next(e["value"] for e in container["env"] if e["name"] == "SERVLANE_GATEWAY_CLIENT_HEAD_TIMEOUT")
        )
        with socket.create_connection(("127.0.0.1", port), timeout=deadline + 30) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
            began = time.monotonic()
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
            waited = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert deadline - 1 < waited < deadline + 10, (waited, deadline)
        gateway.assert_running("serving with every toggle on")
        logs = gateway.logs()
        assert "tracing on" in logs, logs
