"""Fixtures: two real upstreams on loopback, and a factory for gateways in front of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servlane_gateway.app import create_app
from servlane_gateway.settings import GatewaySettings
from servlane_gateway.workers import server_options
from tests.support.batch_databases import postgres
from tests.support.gateway_harness import Gateway, ServedApp, StartGateway, Upstream, loopback_socket
from tests.support.gateway_upstream import create_upstream

# One PostgreSQL for every Batch API module of the session: a session fixture imported into each module
# was one server per module (four, all alive until the session ended).
__all__ = ["postgres"]


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, Upstream]]:
    served: dict[str, Upstream] = {}
    apps = []
    for name in ("v1", "v2"):
        app, state = create_upstream(name)
        runner = ServedApp(app).__enter__()
        apps.append(runner)
        served[name] = Upstream(runner.url, state)
    yield served
    for runner in apps:
        runner.__exit__()


def _gateways(tmp_path: Path, server: dict[str, Any]) -> Iterator[StartGateway]:
    running: list[ServedApp] = []

    def start(objects: list[dict[str, Any]], keys: str | None = None, **settings: Any) -> Gateway:
        routes_file = tmp_path / "routes.json"
        routes_file.write_text(json.dumps(objects))
        if keys is not None:
            (tmp_path / "keys").write_text(keys)
            settings["keys_file"] = tmp_path / "keys"
        metrics = loopback_socket()  # the gateway's metrics port, a second listener of its server
        metrics_port = metrics.getsockname()[1]
        config = GatewaySettings(
            routes_file=routes_file, reload_poll_seconds=0.02, metrics_port=metrics_port, **settings
        )
        app = create_app(config)
        served = ServedApp(app, extra_sockets=(metrics,), **server).__enter__()
        running.append(served)
        return Gateway(served.url, app.state.gateway, routes_file, f"http://127.0.0.1:{metrics_port}/metrics")

    yield start
    for served in running:
        served.__exit__()


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[StartGateway]:
    """Gateways served as `python -m servlane_gateway` serves them (servlane_gateway.workers.server_options)."""
    yield from _gateways(tmp_path, server_options())


@pytest.fixture
def start_gateway_on_plain_uvicorn(tmp_path: Path) -> Iterator[StartGateway]:
    """Gateways on uvicorn's own protocol, as another ASGI server would serve the app."""
    yield from _gateways(tmp_path, {})
