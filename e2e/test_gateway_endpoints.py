"""Endpoint-aware routing against the real API server: the gateway (`--watch`) watches the EndpointSlices of
each AIModel's Service and picks the pod itself.

KWOK pods cannot serve HTTP, so the test writes the EndpointSlices itself, exactly as the EndpointSlice
controller would for the operator's Service `model-<aimodel>` (its labels copied, `kubernetes.io/service-name`
and `endpointslice.kubernetes.io/managed-by` set, owned by the Service), pointing at stub servers on this
machine's own address (the API server refuses loopback endpoints). The Service has no selector, so the real
controller leaves these slices alone. The gateway calls the AIModel's cluster-DNS Service URL, which nothing
here can resolve: every answer below came through a pod the gateway picked. A slice not kept by the
controller for that Service (written by hand) is never used. The operator is paused so that it leaves the
statuses alone.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import uvicorn
from kubernetes import client as kube_client

from e2e.host_services import host_address
from tests.support.cluster_harness import (
    ARTIFACTS,
    GROUP,
    VERSION,
    Kube,
    metrics_url_of,
    wait_until,
    watching_gateway,
)
from tests.support.gateway_upstream import create_upstream

pytestmark = pytest.mark.e2e

MODEL = "m"
SERVICE = f"model-{MODEL}"  # the operator's Service name (servlane_operator.labels.child_name)
SLICES = ("discovery.k8s.io", "v1")


class Pod:
    """A stub OpenAI server on the host's address, standing for one pod."""

    def __init__(self, name: str, host: str) -> None:
        self.name = name
        app, self.state = create_upstream(name)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_until(f"{self.name} started", lambda: self.server.started or not self.thread.is_alive(), 10, 0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    @property
    def received(self) -> int:
        return len(self.state.bodies)


@pytest.fixture
def pods() -> Iterator[dict[str, Pod]]:
    host = host_address()
    started = {name: Pod(name, host) for name in ("pod-a", "pod-b", "pod-c")}
    for pod in started.values():
        pod.start()
    yield started
    for pod in started.values():
        pod.state.released.set()
        pod.stop()


@pytest.fixture
def gateway(kube: Kube, paused_operator: None, namespace: str) -> Iterator[str]:
    with watching_gateway(kube, "gateway-endpoints.log", "--namespaces", namespace, "--connect-timeout", "2") as url:
        yield url


MANAGED_BY = {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}


def create_service(kube: Kube, namespace: str) -> str:
    """The operator's Service for the AIModel, without a selector (see the module's docstring); its uid."""
    body = kube_client.V1Service(
        metadata=kube_client.V1ObjectMeta(name=SERVICE, labels={"servlane.dev/model": MODEL}),
        spec=kube_client.V1ServiceSpec(ports=[kube_client.V1ServicePort(name="http", port=8000, protocol="TCP")]),
    )
    created = kube.core.create_namespaced_service(namespace, body)
    assert created.metadata is not None
    return str(created.metadata.uid)


def endpoint_slice(
    pod: str, host: str, port: int, ready: bool = True, terminating: bool = False, service_uid: str = ""
) -> dict[str, Any]:
    """One slice per pod: the stubs share an address and differ by port, and a slice has one port list. With
    `service_uid`, as the EndpointSlice controller writes it; without, as a hand-made one would look."""
    labels = {"kubernetes.io/service-name": SERVICE, "servlane.dev/model": MODEL, **MANAGED_BY}
    conditions = {"ready": ready, "serving": ready or terminating, "terminating": terminating}
    owner = {"apiVersion": "v1", "kind": "Service", "name": SERVICE, "uid": service_uid, "controller": True,
             "blockOwnerDeletion": True}  # fmt: skip
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{SERVICE}-{pod}", "labels": labels, "ownerReferences": [owner] if service_uid else []},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [host], "conditions": conditions, "targetRef": {"kind": "Pod", "name": pod}}],
    }


def create_slice(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(*SLICES, namespace, "endpointslices", body)


def patch_slice(kube: Kube, namespace: str, pod: str, patch: dict[str, Any]) -> None:
    kube.custom.patch_namespaced_custom_object(*SLICES, namespace, "endpointslices", f"{SERVICE}-{pod}", patch)


def delete_slice(kube: Kube, namespace: str, pod: str) -> None:
    kube.custom.delete_namespaced_custom_object(*SLICES, namespace, "endpointslices", f"{SERVICE}-{pod}")


def ask(client: openai.OpenAI, model: str, text: str = "hi") -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return str(reply.choices[0].message.content)


class Load:
    """Requests in a loop from a few threads until stopped; every failure is kept."""

    def __init__(self, url: str, model: str, threads: int = 3) -> None:
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
        self.model = model
        self.stop = threading.Event()
        self.answers: list[str] = []
        self.failures: list[str] = []
        self.workers = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.answers.append(ask(self.client, self.model))
            except Exception as exc:
                self.failures.append(repr(exc))

    def __enter__(self) -> Load:
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.join(30)


def metric(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(metrics_url_of(url), timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_gateway_picks_pods_from_endpointslices(
    paused_operator: None, kube: Kube, namespace: str, pods: dict[str, Pod], gateway: str
) -> None:
    spec: dict[str, Any] = {"source": {"uri": "/models/x"}, "engine": "transformers"}
    kube.create_model(namespace, MODEL, spec)
    status = {
        "endpoint": f"http://{SERVICE}.{namespace}.svc.cluster.local:8000/v1",
        "servedModelName": MODEL,
        "phase": "Ready",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }  # fmt: skip
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "aimodels", MODEL, {"status": status})
    kube.create_feature(namespace, "chat", {"model": MODEL, "routing": "round-robin"})
    weights = {"status": {"weights": [{"model": MODEL, "weight": 100}]}}
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "aifeatures", "chat", weights)
    service_uid = create_service(kube, namespace)
    for pod in pods.values():
        create_slice(kube, namespace, endpoint_slice(pod.name, pod.host, pod.port, service_uid=service_uid))
    # Carries the controller's labels but no owner: written by hand, it must never get a request.
    intruder = Pod("intruder", pods["pod-a"].host)
    intruder.start()
    create_slice(kube, namespace, endpoint_slice(intruder.name, intruder.host, intruder.port))
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=20)
    chat = f"{namespace}/chat"

    def every_pod_answers() -> bool:
        try:
            return {ask(client, chat) for _ in range(6)} == set(pods)
        except openai.APIStatusError as exc:  # routes or slices not delivered yet
            if exc.status_code in (404, 503):
                return False
            raise

    wait_until("every pod answers", every_pod_answers, timeout=30, interval=0.05)

    # Round-robin over the three ready pods: an even spread.
    before = {name: pod.received for name, pod in pods.items()}
    for _ in range(30):
        ask(client, chat)
    assert {name: pod.received - before[name] for name, pod in pods.items()} == dict.fromkeys(pods, 10)
    assert intruder.received == 0
    intruder.stop()
    assert metric(gateway, "servlane_gateway_endpoint_picks_total", model=MODEL, pod="pod-a") >= 10

    # A pod whose endpoint leaves the slice gets no more traffic within a second.
    c = pods["pod-c"]
    patch_slice(kube, namespace, "pod-c", {"endpoints": []})
    removed = time.monotonic()

    def c_left() -> bool:
        seen = c.received
        for _ in range(3):  # round-robin over three would reach it within three requests
            ask(client, chat)
        return c.received == seen

    wait_until("pod-c's traffic stopped", c_left, timeout=1.0, interval=0.0)
    assert time.monotonic() - removed < 1.5  # the last check's requests included
    seen = c.received
    assert {ask(client, chat) for _ in range(10)} == {"pod-a", "pod-b"}
    assert c.received == seen

    # Scale-down under load: the pod holding a stream is marked terminating, then removed. It gets no new
    # request, its stream finishes, and no request of the load fails.
    streamed: list[str] = []

    def stream_held() -> None:
        stream = client.chat.completions.create(
            model=chat, messages=[{"role": "user", "content": "hold chunks=3"}], stream=True
        )
        streamed.extend(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    holder_thread = threading.Thread(target=stream_held)
    holder_thread.start()

    def holding_pod() -> Pod | None:
        for pod in (pods["pod-a"], pods["pod-b"]):
            if any("hold" in str(body.get("messages")) for body in pod.state.bodies):
                return pod
        return None

    holder = wait_until("the stream reached a pod", holding_pod, timeout=10, interval=0.02)
    other = pods["pod-b"] if holder is pods["pod-a"] else pods["pod-a"]
    with Load(gateway, chat) as load:
        wait_until("load flows", lambda: len(load.answers) >= 10, timeout=20, interval=0.02)
        terminating = endpoint_slice(holder.name, holder.host, holder.port, ready=False, terminating=True)
        patch_slice(kube, namespace, holder.name, {"endpoints": terminating["endpoints"]})
        marked = time.monotonic()

        def holder_drained() -> bool:
            seen = holder.received
            answered = len(load.answers)
            wait_until("more answers", lambda: len(load.answers) >= answered + 6, timeout=10, interval=0.005)
            return holder.received == seen

        wait_until(f"{holder.name} drained", holder_drained, timeout=5, interval=0.0)
        drained_after = time.monotonic() - marked
        seen = holder.received
        answered = len(load.answers)
        wait_until("load goes on", lambda: len(load.answers) >= answered + 20, timeout=20, interval=0.02)
        assert holder.received == seen, "a terminating pod got a new request"
        holder.state.released.set()  # the stream in flight finishes on the draining pod
        holder_thread.join(15)
        delete_slice(kube, namespace, holder.name)  # the pod is gone
        answered = len(load.answers)
        wait_until("load after the removal", lambda: len(load.answers) >= answered + 20, timeout=20, interval=0.02)
    assert load.failures == [], load.failures[:3]
    assert "".join(streamed).split() == [holder.name] * 3
    assert holder.state.streams_completed == 1
    assert other.received > 0
    (ARTIFACTS / "gateway-endpoints-latency.txt").write_text(f"terminating pod drained after {drained_after:.3f}s\n")

    # A pod that refuses connections: retried on another pod, no client-visible error, then ejected.
    with socket.socket() as sock:
        sock.bind((other.host, 0))
        dead_port = sock.getsockname()[1]
    create_slice(kube, namespace, endpoint_slice("pod-dead", other.host, dead_port, service_uid=service_uid))

    def dead_ejected() -> bool:
        assert ask(client, chat) == other.name
        return metric(gateway, "servlane_gateway_endpoint_ejections_total", model=MODEL, pod="pod-dead") >= 1

    wait_until("the refusing pod ejected", dead_ejected, timeout=10, interval=0.0)
    assert {ask(client, chat) for _ in range(10)} == {other.name}
