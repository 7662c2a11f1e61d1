"""Serving apps with uvicorn on loopback in background threads, and building API objects for routes."""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import openai
import uvicorn

from servlane_core.routing.picking import pick_backend
from servlane_core.routing.routes import Route, RouteTable
from servlane_gateway.state import GatewayState
from tests.support.gateway_upstream import UpstreamState
from tests.support.polling import wait_until


@dataclass
class Upstream:
    url: str
    state: UpstreamState


@dataclass
class Gateway:
    url: str
    state: GatewayState
    routes_file: Path
    metrics_url: str = ""  # /metrics on the gateway's metrics port (the API port has none)

    def client(self, api_key: str = "unused", **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("timeout", 10)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def write_routes(self, objects: list[dict[str, Any]]) -> None:
        tmp = self.routes_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(objects))
        tmp.replace(self.routes_file)  # atomic, like a ConfigMap update

    def sample(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels, summed over `namespace` unless that is given too."""
        total = 0.0
        for family in self.state.metrics.registry.collect():
            for s in family.samples:
                rest = {k: v for k, v in s.labels.items() if k not in labels}
                if (
                    s.name == name
                    and all(s.labels.get(k) == v for k, v in labels.items())
                    and set(rest) <= {"namespace"}
                ):
                    total += s.value
        return total


class StartGateway(Protocol):
    def __call__(self, objects: list[dict[str, Any]], keys: str | None = None, **settings: Any) -> Gateway: ...


def route_in(table: RouteTable | None, name: str) -> Route:
    route = table.lookup(name) if table is not None else None
    assert route is not None, f"no route {name!r}"
    return route


def picked(route: Route, sticky: str | None) -> str:
    """The model the gateway's own picking chooses for this id."""
    backend = pick_backend(route, sticky)
    assert backend is not None
    return backend.model


class ServedApp:
    """An ASGI app served by uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any, extra_sockets: tuple[socket.socket, ...] = (), **options: Any) -> None:
        """`extra_sockets`: more listeners of the same server (the gateway's metrics port: loopback_socket())."""
        self.sock = loopback_socket()
        self.extra_sockets = extra_sockets
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"access_log": False} | options
        config = uvicorn.Config(app, log_level="critical", lifespan="on", **options)
        self.server = uvicorn.Server(config)
        sockets = [self.sock, *extra_sockets]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, daemon=True)

    def __enter__(self) -> ServedApp:
        self.thread.start()
        wait_until("uvicorn to start", lambda: self.server.started or not self.thread.is_alive(), 10)
        if not self.server.started:
            raise RuntimeError("the server did not start")
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        for sock in (self.sock, *self.extra_sockets):
            sock.close()


def loopback_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1, for uvicorn to listen on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def refused_url() -> str:
    """A loopback URL where nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def aimodel(
    name: str, endpoint: str | None, ready: bool = True, served: str | None = None, status_served: str | None = None
) -> dict[str, Any]:
    """`status_served`: a served name in the status only, where the spec's rules do not reach (e.g. one with
    `/`, which the API refuses in the spec but an operator could still have reported)."""
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "reason": "Test"}]
    status: dict[str, Any] = {"conditions": conditions}
    if status_served:
        status["servedModelName"] = status_served
    if endpoint:
        status["endpoint"] = endpoint
    spec: dict[str, Any] = {"source": {"uri": "/models/x"}, "engine": "transformers"}
    if served:
        spec["servedModelName"] = served
    meta = {"name": name, "namespace": "default"}
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def aifeature(
    name: str, weights: list[tuple[str, int]], defaults: dict[str, Any] | None = None, namespace: str = "default"
) -> dict[str, Any]:
    split = [{"model": m, "weight": w} for m, w in weights]
    fixed_split = len(weights) > 1 and sum(w for _, w in weights) == 100
    spec: dict[str, Any] = {"split": split} if fixed_split else {"model": weights[0][0]}
    if defaults:
        spec["defaults"] = defaults
    meta = {"name": name, "namespace": namespace}
    obj = {"apiVersion": "servlane.dev/v1alpha1", "kind": "AIFeature", "metadata": meta, "spec": spec}
    return obj | {"status": {"weights": split}}


logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the cut-stream test raises on purpose
