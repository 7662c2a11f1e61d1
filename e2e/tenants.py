"""Two teams sharing one gateway (e2e/test_namespaces.py): who they are, their API keys, the gateway as a
process watching the whole cluster, single requests with a key, and the gateway's metric series by label."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localcluster.cluster import stop_process_groups
from tests.support.cluster_harness import ARTIFACTS, ROOT, Kube, dump_namespace, namespace_body, wait_until
from tests.support.ports import free_port
from tests.support.raw_http import read_response_head

MODELS = ("v1", "v2")  # the AIModels every team has, under the same names
Samples = dict[frozenset[tuple[str, str]], float]  # a metric's samples by their labels


@dataclass(frozen=True)
class Team:
    """A namespace with AIModels v1 and v2 and an AIFeature `chat`, and the API key scoped to it."""

    namespace: str
    letter: str  # what the team's runtimes answer as: served model names "a-v1", "b-v2", ...
    key: str

    @property
    def chat(self) -> str:
        return f"{self.namespace}/chat"

    def served(self, model: str) -> str:
        """The served model name of the team's AIModel `model`: the `model` its runtime answers with, which
        tells clients which namespace answered (the AIModels themselves have the same names)."""
        return f"{self.letter}-{model}"

    def endpoint(self, model: str) -> str:
        """The in-cluster endpoint the operator gives the AIModel, rewritten by --endpoint-override."""
        return f"http://model-{model}.{self.namespace}.svc.cluster.local:8000"


def new_key() -> str:
    return "sk-" + secrets.token_hex(16)


def keys_file(path: Path, entries: dict[str, tuple[str, str]]) -> Path:
    """`NAME: KEY SCOPES` lines (access.py's format), scopes "" for a key that may call everything."""
    path.write_text("".join(f"{name}: {key} {scopes}".rstrip() + "\n" for name, (key, scopes) in entries.items()))
    return path


@dataclass
class GatewayProcess:
    """`python -m servlane_gateway --watch` over the whole cluster (as the chart runs it by default)."""

    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    metrics_url: str  # /metrics is on a port of its own

    @classmethod
    def start(
        cls,
        kube: Kube,
        port: int,
        log: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        metrics_port: int | None = None,
    ) -> GatewayProcess:
        """`env`: variables on top of this process's (e.g. OpenTelemetry's). `metrics_port`: where /metrics is
        served (a Prometheus may scrape a fixed one); None: a free port."""
        metrics_port = metrics_port or free_port()
        command = [sys.executable, "-m", "servlane_gateway", "--watch", "--host", "127.0.0.1", "--port", str(port),
                   "--metrics-port", str(metrics_port), "--first-byte-timeout", "10",
                   # No node runs these models' pods: a request for one that is Deploying is held this long
                   # (not the default 300 s), then a 503 as before holding.
                   "--hold-max-wait-seconds", "3", *args]  # fmt: skip
        with log.open("ab") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                env={**os.environ, "KUBECONFIG": str(kube.kubeconfig), **(env or {})},
            )  # fmt: skip
        gateway = cls(f"http://127.0.0.1:{port}", log, proc, f"http://127.0.0.1:{metrics_port}/metrics")
        wait_until("gateway ready", gateway._ready, timeout=30)
        return gateway

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway exited with {self.proc.returncode}; see {self.log}")
        try:
            return httpx.get(self.url + "/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        stop_process_groups([self.proc.pid], timeout=10)
        self.proc.wait(timeout=5)

    def chat(
        self, key: str | None, model: str, text: str = "Hello!", headers: dict[str, str] | None = None, **fields: Any
    ) -> httpx.Response:
        """One small chat completion as a client with `key` (None: no Authorization header); `fields` are
        more of the body's (e.g. temperature), `headers` more request headers."""
        sent = {**({"Authorization": f"Bearer {key}"} if key is not None else {}), **(headers or {})}
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 3, **fields}
        with httpx.Client(trust_env=False, timeout=30) as client:  # loopback: never through a proxy
            return client.post(self.url + "/v1/chat/completions", json=body, headers=sent)

    def client(self, key: str) -> openai.OpenAI:
        """The official client as a caller with `key` (the Batch API's files and batches)."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def answer_before_the_body(self, head: str, body_start: bytes, timeout: float = 10) -> bytes:
        """The status line and headers the gateway answers a request whose `head` (request line and headers,
        without the blank line) promises more body than `body_start`, which is all that is ever sent: an
        answer means the gateway decided without waiting for the rest. A timeout raises (socket.timeout)."""
        host, port = self.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(head.encode() + b"\r\n\r\n" + body_start)
            return read_response_head(sock)

    def concurrently(self, calls: list[tuple[str, str]]) -> list[httpx.Response]:
        """`chat(key, model)` for every (key, model) at once, the answers in the same order."""
        with ThreadPoolExecutor(len(calls)) as pool:
            return list(pool.map(lambda call: self.chat(*call), calls))

    def models(self, key: str) -> list[str]:
        with httpx.Client(trust_env=False, timeout=10) as client:
            reply = client.get(self.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        reply.raise_for_status()
        return sorted(m["id"] for m in reply.json()["data"])

    def samples(self, name: str) -> Samples:
        """Every sample of the metric `name` (with its suffix, e.g. ..._total) by its labels."""
        text = httpx.get(self.metrics_url, timeout=5).text
        return {
            frozenset(s.labels.items()): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        }

    def logged(self, text: str) -> bool:
        return text in self.log.read_text()


def answered_by(reply: httpx.Response) -> str:
    """The served model name that answered a successful request (the runtime's `model`)."""
    assert reply.status_code == 200, f"expected 200, got {reply.status_code}: {reply.text}"
    return str(reply.json()["model"])


def openai_error(reply: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-style error object of a refusal with `status`; fails on any other shape."""
    assert reply.status_code == status, f"expected {status}, got {reply.status_code}: {reply.text}"
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert isinstance(error, dict), error
    assert {"message", "type", "code"} <= error.keys(), error
    return error


def select(samples: Samples, **labels: str) -> Samples:
    """The samples whose labels include all of `labels`."""
    wanted = set(labels.items())
    return {key: value for key, value in samples.items() if wanted <= key}


@pytest.fixture(scope="module")
def teams(request: pytest.FixtureRequest, crds: Kube) -> Iterator[tuple[Team, Team]]:
    suffix = uuid.uuid4().hex[:6]
    pair = (Team(f"team-a-{suffix}", "a", new_key()), Team(f"team-b-{suffix}", "b", new_key()))
    failures = request.session.testsfailed
    for team in pair:
        crds.core.create_namespace(namespace_body(team.namespace))
    try:
        yield pair
    finally:
        for team in pair:
            if request.session.testsfailed != failures:
                dump_namespace(crds, team.namespace, ARTIFACTS / "dumps" / team.namespace)
            crds.core.delete_namespace(team.namespace)
