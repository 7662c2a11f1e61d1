"""The keystone: our CPU runtime image really serves an AIModel on a real pod (root, the real node's binaries
and the locally built image ghcr.io/servlane/runtime:0.1.0-cpu needed; see localcluster/README.md, "A real
node"; part of `make test`, SERVLANE_REAL_NODE=0 opts out).

The image is imported from Docker into the real node's containerd, the tiny Llama reaches the pod through a
`pvc://` source (a static `local` PersistentVolume on real-node-1, bound to its claim by name), the operator runs
as a real process with its ServiceAccount token, and the host asks the model's Service ClusterIP (kube-proxy)
with the official `openai` client. A failing pod is reported with its status, events and the runtime's log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import (
    RUNTIME_CPU_IMAGE as RUNTIME_IMAGE,
)
from tests.support.cluster_harness import (
    Kube,
    OperatorProcess,
)
from tests.support.polling import wait_until
from tests.support.real_pods import (
    NODE,
    ModelRollout,
    answers_200,
    describe_model,
    gone,
    local_model_claim,
    model_on_the_real_node,
    operator_process,
    pods,
    real_node_kube,
)

pytestmark = [
    pytest.mark.e2e,
    # The first test's setup brings the cluster up and imports a 7 GB image: more than the suite's 600 s.
    pytest.mark.timeout(1800),
]

NAMESPACE = "real-pods-e2e"
CLAIM = "tiny-models"
# The model loads in ~10-40 s on 2 cores once the container runs; the image's first start (python + torch
# imports from a cold page cache) adds to it.
READY_DEADLINE_SECONDS = 600
# Adapter folders in the claim.
ADAPTERS = ("lora-1", "lora-2")
# The real node's kubelet syncs ConfigMap volumes every 10 s (syncFrequency; a cluster's default is 1 min).
ADAPTER_SYNC_SECONDS = 120


@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster, real_node_images: list[str]) -> LocalCluster:
    assert RUNTIME_IMAGE in real_node_images
    return real_cluster


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    return real_node_kube(cluster, NAMESPACE)


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: Kube) -> Iterator[OperatorProcess]:
    with operator_process(cluster, kube, "operator") as process:
        yield process


@pytest.fixture(scope="module")
def model_claim(cluster: LocalCluster, kube: Kube) -> str:
    """A claim holding the tiny Llama and two LoRA adapters of it (ADAPTERS); returns the model's folder inside it."""
    from servlane_devtools.tiny_model import build_tiny_adapter, build_tiny_llama

    source = build_tiny_llama()
    adapters = {folder: build_tiny_adapter(seed) for seed, folder in enumerate(ADAPTERS, start=1)}
    local_model_claim(cluster, NAMESPACE, CLAIM, {source.name: source, **adapters})
    return source.name


def model_spec(model_dir: str, **extra: Any) -> dict[str, Any]:
    resources = extra.pop("resources", {"cpu": "1500m", "memory": "4Gi"})
    return model_on_the_real_node(CLAIM, model_dir, resources, **{"replicas": 1, **extra})


def service_base_url(c: LocalCluster, model: str) -> str:
    """The model's OpenAI base URL at its Service's ClusterIP (through kube-proxy), once /models answers."""
    service = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/services/model-{model}")
    base = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/v1"
    wait_until(
        f"GET {base}/models through the ClusterIP",
        lambda: answers_200(f"{base}/models"),
        timeout=60,
        interval=0.5,
        tolerate=lambda exc: isinstance(exc, OSError),
    )
    return base


# status.coldStart's steps, in order (servlane_api.cold_start.ColdStartPhases), then total.
STEPS = (
    "scheduled", "imageReady", "containerStarted", "runtimeImports", "weightsFetched", "engineLoaded",
    "runtimeReady", "podReady", "firstToken", "total",
)  # fmt: skip


def last_cold_start(kube: Kube, model: str, pod: str) -> dict[str, Any] | None:
    """status.coldStart.last once it is `pod`'s start."""
    last = ((kube.get_model(NAMESPACE, model).get("status") or {}).get("coldStart") or {}).get("last") or {}
    return dict(last) if last.get("pod") == pod else None


def describe(c: LocalCluster, model: str) -> str:
    return describe_model(c, NAMESPACE, model)


def test_runtime_image_serves_an_aimodel_on_a_real_pod(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: str
) -> None:
    c, name = cluster, "tiny"
    rollout = ModelRollout(c, kube, NAMESPACE, name)
    kube.create_model(NAMESPACE, name, model_spec(model_claim))
    model = rollout.wait_ready(READY_DEADLINE_SECONDS)
    print(f"\napply -> {rollout.timings()}")

    pod = rollout.pod
    # The operator explains the start (status.coldStart): Kubernetes' steps and the runtime's own (/startup).
    cold = wait_until(
        "the pod's start in status.coldStart", lambda: last_cold_start(kube, name, pod["metadata"]["name"]), timeout=60
    )
    print("cold start: " + ", ".join(f"{step} {cold.get(step)}s" for step in STEPS))
    assert all(cold.get(step) is not None for step in STEPS if step != "firstToken"), cold
    # Each step from the one before: together they are the total, give or take Kubernetes' whole seconds.
    assert abs(sum(cold[step] for step in STEPS[:-2]) - cold["total"]) <= 2.0, cold
    assert pod["spec"]["nodeName"] == NODE, describe(c, name)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == RUNTIME_IMAGE
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    status = model["status"]
    assert status["readyReplicas"] == 1, status
    assert status["endpoint"] == f"http://model-{name}.{NAMESPACE}.svc.cluster.local:8000/v1", status
    assert {x["type"]: x["status"] for x in status["conditions"]}["Ready"] == "True", status

    # The model's Service, from the host: its ClusterIP through kube-proxy's rules.
    base = service_base_url(c, name)
    http = openai.DefaultHttpxClient(trust_env=False, timeout=120)  # a ClusterIP: never through a proxy
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
    try:
        assert [m.id for m in client.models.list().data] == [name], describe(c, name)

        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
        )
        # The weights are random: greedy tokens may decode to nothing printable, so the proof of generation is
        # the token count, and an answer of exactly max_tokens tokens unless the model chose to stop.
        answer = reply.choices[0]
        assert answer.message.role == "assistant"
        assert isinstance(answer.message.content, str), describe(c, name)
        assert answer.finish_reason in ("stop", "length")
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 0
        assert 0 < reply.usage.completion_tokens <= 8
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        if answer.finish_reason == "length":
            assert reply.usage.completion_tokens == 8
        print(f"chat: {answer.message.content!r} ({answer.finish_reason}, {reply.usage})")

        stream = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, deltas, usage = "", None, 0, None
        for chunk in stream:
            usage = chunk.usage or usage
            if chunk.choices:
                deltas += 1
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert deltas > 2, (deltas, describe(c, name))  # streamed as it was generated, not one answer
        assert finish in ("stop", "length")
        assert usage is not None  # the final chunk (stream_options.include_usage)
        assert usage.prompt_tokens > 0
        assert 0 < usage.completion_tokens <= 8
        print(f"streamed chat: {text!r} in {deltas} chunks ({finish}, {usage})")
    finally:
        client.close()

    # The first token served is added to the start once the operator rechecks the runtime's /startup.
    def with_first_token() -> dict[str, Any] | None:
        got = last_cold_start(kube, name, pod["metadata"]["name"])
        return got if got is not None and got.get("firstToken") is not None else None

    first = wait_until("status.coldStart's first token", with_first_token, timeout=90, interval=1)
    print(f"first token {first['firstToken']}s after the pod's Ready")
    assert first["firstToken"] >= 0, first

    # Still the first container: no restart from a probe along the way.
    pod = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
    assert [cs["restartCount"] for cs in pod["status"]["containerStatuses"]] == [0], describe(c, name)

    kube.delete_model(NAMESPACE, name)
    pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
    # preStop sleeps 10 s, then the runtime drains; the grace period allows 100 s.
    wait_until("the model's pod deleted", lambda: gone(c, pod_path), timeout=180, interval=0.5)
    assert cluster.node is not None
    node = cluster.node
    wait_until(
        "no runtime container left on the node",
        lambda: RUNTIME_IMAGE not in node.ctr("containers", "ls").stdout,
        timeout=60,
        interval=0.5,
    )


def test_a_model_that_cannot_load_is_reported_on_the_aimodel(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: str
) -> None:
    """A source folder that is not in the claim: the runtime exits with the reason, the kubelet restarts it, and
    the AIModel says why it does not serve (the container's termination message) within a minute or two, not
    after the 30-minute startup probe."""
    c, name = cluster, "broken"
    kube.create_model(NAMESPACE, name, model_spec("no-such-model", resources={"cpu": "500m", "memory": "2Gi"}))

    def reported() -> dict[str, Any] | None:
        status = kube.get_model(NAMESPACE, name).get("status") or {}
        explained = [x for x in status.get("conditions", []) if "/mnt/models/no-such-model" in (x.get("message") or "")]
        return status if explained and status.get("phase") != "Ready" else None

    try:
        status = wait_until("the AIModel reports the load failure", reported, timeout=240, interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(c, name)}") from None
    conditions = {x["type"]: x for x in status["conditions"]}
    print(f"\nconditions of a model that cannot load: {json.dumps(conditions, indent=1)}")
    assert conditions["Ready"]["status"] == "False", status
    story = describe(c, name)
    assert "/mnt/models/no-such-model" in story  # the runtime's own log line, via the API server
    assert f"node={NODE}" in story

    kube.delete_model(NAMESPACE, name)
    wait_until(
        "the broken model's pods deleted",
        lambda: not pods(c, NAMESPACE, f"servlane.dev/model={name}"),
        timeout=180,
        interval=0.5,
    )


def test_adapters_come_and_go_on_a_running_pod(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: str
) -> None:
    c, name = cluster, "tiny-lora"
    rollout = ModelRollout(c, kube, NAMESPACE, name)
    first = {"name": "sql-v1", "source": f"pvc://{CLAIM}/{ADAPTERS[0]}"}
    second = {"name": "sql-v2", "source": f"pvc://{CLAIM}/{ADAPTERS[1]}"}
    kube.create_model(NAMESPACE, name, model_spec(model_claim, adapters=[first]))
    rollout.wait_ready(READY_DEADLINE_SECONDS)
    pod = rollout.pod
    base = service_base_url(c, name)
    http = openai.DefaultHttpxClient(trust_env=False, timeout=120)
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)

    def served() -> set[str]:
        return {m.id for m in client.models.list().data}

    def answers(model: str) -> str:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4, temperature=0
        )
        return reply.model

    try:
        assert served() == {name, "sql-v1"}, describe(c, name)  # loaded before the pod turned ready
        assert answers("sql-v1") == "sql-v1"

        kube.patch_model(NAMESPACE, name, {"spec": {"adapters": [first, second]}})
        wait_until("sql-v2 served by the running pod", lambda: "sql-v2" in served(), ADAPTER_SYNC_SECONDS, 1.0)
        assert answers("sql-v2") == "sql-v2"

        kube.patch_model(NAMESPACE, name, {"spec": {"adapters": [second]}})
        wait_until("sql-v1 gone", lambda: "sql-v1" not in served(), ADAPTER_SYNC_SECONDS, 1.0)
        with pytest.raises(openai.NotFoundError):
            answers("sql-v1")
        assert answers(name) == name
    finally:
        client.close()

    # The same pod and container all along: adapters changed, nothing restarted.
    (now,) = pods(c, NAMESPACE, f"servlane.dev/model={name}")
    assert now["metadata"]["name"] == pod["metadata"]["name"], describe(c, name)
    assert [cs["restartCount"] for cs in now["status"]["containerStatuses"]] == [0], describe(c, name)
    kube.delete_model(NAMESPACE, name)
    pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
    wait_until("the model's pod deleted", lambda: gone(c, pod_path), timeout=180, interval=0.5)
