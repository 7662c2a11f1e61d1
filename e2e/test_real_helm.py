"""The product as a platform team installs it, on pods that really run (the real node, e2e/conftest.py
`real_cluster`): `helm install` of our chart with our locally built images (operator and gateway pods), AIModels
whose runtime pods load a tiny Llama and all-MiniLM-L6-v2 from a `pvc://` claim, the gateway pod routing to them by
watching the cluster, and the `openai` client on the host calling the gateway's NodePort. Then a canary to a
second real model is promoted under traffic, a canary whose runtime keeps crashing is rolled back, and `helm
uninstall` (before the custom resources, as a careless uninstall does) leaves nothing running.

Times are printed (apply -> Ready with its breakdown, rollout durations) and written to
.artifacts/real-helm-timings.json.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from e2e.traffic import Load
from localcluster.cluster import LocalCluster
from servlane_operator.labels import GATEWAY_LABELS
from tests.support.cluster_harness import (
    ARTIFACTS,
    GATEWAY_IMAGE,
    OPERATOR_IMAGE,
    RUNTIME_CPU_IMAGE,
    Kube,
)
from tests.support.helm_install import gateway_node_port, helm_or_fail, install_chart, uninstall_chart
from tests.support.helmtool import Helm
from tests.support.pod_netns import blocked, get_in_pod, netns_of
from tests.support.polling import wait_until
from tests.support.real_pods import (
    NODE,
    NODE_SELECTOR,
    ModelRollout,
    answers_200,
    describe_model,
    describe_pods,
    ensure_namespace,
    local_model_claim,
    model_on_the_real_node,
    pods,
)

# Part of `make test` with the other real-node suites (SERVLANE_REAL_NODE=0 opts out of all of them).
pytestmark = [
    pytest.mark.e2e,
    # The first test imports our images into the node (~2-3 min) and installs the chart; rollouts take minutes.
    pytest.mark.timeout(1800),
]

RELEASE, SYSTEM, TEAM = "servlane", "servlane-system", "team-real"
CLAIM = "models"
ROLLOUT = {"steps": [50, 100], "interval": "20s", "analysis": {"minRequests": 5, "maxErrorRate": 0.1}}
READY_DEADLINE_SECONDS = 420
TIMINGS = ARTIFACTS / "real-helm-timings.json"


@dataclass
class Installed:
    cluster: LocalCluster
    kube: Kube
    helm: Helm
    gateway_url: str = ""  # http://127.0.0.1:<nodePort>/v1
    timings: dict[str, Any] = field(default_factory=dict)

    def helm_run(self, *args: str) -> str:
        return self.helm.run(*args, "--namespace", SYSTEM, kubeconfig=self.cluster.kubeconfig).stdout

    def record(self, what: str, value: Any) -> None:
        self.timings[what] = value
        print(f"\n{what}: {value}")
        TIMINGS.write_text(json.dumps(self.timings, indent=1))

    def story(self) -> str:
        """The chart's pods and every model's pods, for a failure message."""
        parts = [describe_pods(self.cluster, SYSTEM, f"app.kubernetes.io/instance={RELEASE}")]
        features = self.cluster.api("GET", f"/apis/servlane.dev/v1alpha1/namespaces/{TEAM}/aifeatures")["items"]
        parts += [f"AIFeature {f['metadata']['name']}: {json.dumps(f.get('status'), indent=1)}" for f in features]
        models = self.cluster.api("GET", f"/apis/servlane.dev/v1alpha1/namespaces/{TEAM}/aimodels")["items"]
        parts += [describe_model(self.cluster, TEAM, m["metadata"]["name"]) for m in models]
        return "\n".join(parts)

    def feature(self, name: str = "chat") -> dict[str, Any]:
        got: dict[str, Any] = self.kube.get_feature(TEAM, name).get("status") or {}
        return got


def values() -> dict[str, Any]:
    """The chart's defaults but for: one namespace watched, pods on the real node (the cluster's other nodes are
    KWOK's), one gateway replica behind a NodePort (the host's way in), images already on the node."""
    on_real_node = {"nodeSelector": NODE_SELECTOR}
    return {
        "operator": {"watchNamespaces": [TEAM], **on_real_node},
        "gateway": {
            "replicaCount": 1,
            "service": {"type": "NodePort"},
            "podDisruptionBudget": {"enabled": False},
            **on_real_node,
        },
    }


@pytest.fixture(scope="module")
def installed(real_cluster: LocalCluster, real_node_images: list[str]) -> Iterator[Installed]:
    assert {RUNTIME_CPU_IMAGE, OPERATOR_IMAGE, GATEWAY_IMAGE} <= set(real_node_images)
    inst = Installed(real_cluster, Kube(real_cluster.kubeconfig), helm_or_fail())
    ensure_namespace(real_cluster, TEAM)
    seconds = install_chart(
        real_cluster, inst.helm, RELEASE, SYSTEM, values(), ARTIFACTS / "real-helm-values.yaml", inst.story
    )
    inst.record("helm install --wait (s)", round(seconds, 1))
    inst.gateway_url = gateway_node_port(real_cluster, RELEASE, SYSTEM) + "/v1"
    yield inst
    uninstall_chart(real_cluster, inst.helm, RELEASE, SYSTEM)


def model_spec(folder: str, **extra: Any) -> dict[str, Any]:
    # Small requests: the node has 2 CPUs for three or four runtimes, the operator and the gateway.
    return model_on_the_real_node(CLAIM, folder, {"cpu": "200m", "memory": "1536Mi"}, **extra)


def apply_model(inst: Installed, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    rollout = ModelRollout(inst.cluster, inst.kube, TEAM, name)
    inst.kube.create_model(TEAM, name, spec)
    got = rollout.wait_ready(READY_DEADLINE_SECONDS)
    inst.record(f"apply -> Ready, {name}", rollout.timings())
    return got


def client(inst: Installed) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(trust_env=False, timeout=60)
    return openai.OpenAI(base_url=inst.gateway_url, api_key="unused", max_retries=0, http_client=http)


def test_the_chart_runs_our_operator_and_gateway_pods(installed: Installed) -> None:
    c = installed.cluster
    found = pods(c, SYSTEM, f"app.kubernetes.io/instance={RELEASE}")
    images = {p["spec"]["containers"][0]["image"] for p in found}
    assert images == {OPERATOR_IMAGE, GATEWAY_IMAGE}, installed.story()
    for pod in found:
        assert pod["spec"]["nodeName"] == NODE
        statuses = pod["status"]["containerStatuses"]
        assert all(cs["ready"] and cs["restartCount"] == 0 for cs in statuses), installed.story()
    # Each talks to the API server in-cluster with its own ServiceAccount: no RBAC refusal in their logs.
    story = installed.story()
    assert "Forbidden" not in story, story
    assert "Unauthorized" not in story, story


@pytest.fixture(scope="module")
def served(installed: Installed) -> Installed:
    """tiny-a answers `chat`, minilm answers `embeddings`, through the gateway pod."""
    from servlane_devtools.tiny_model import build_tiny_llama
    from tests.support.models import minilm_dir

    local_model_claim(installed.cluster, TEAM, CLAIM, {"tiny": build_tiny_llama(), "minilm": minilm_dir()})
    apply_model(installed, "tiny-a", model_spec("tiny"))
    apply_model(installed, "minilm", model_spec("minilm", task="embed", engineOptions={"maxModelLen": 256}))
    installed.kube.create_feature(TEAM, "chat", {"model": "tiny-a", "rollout": ROLLOUT})
    installed.kube.create_feature(TEAM, "embeddings", {"model": "minilm"})

    def routed() -> bool:
        listed = {m.id for m in client(installed).models.list().data}
        return {"chat", "embeddings"} <= listed

    wait_until(
        "the gateway pod lists chat and embeddings",
        routed,
        timeout=120,
        interval=1,
        tolerate=lambda exc: isinstance(exc, (openai.APIError, OSError)),
    )
    return installed


def test_the_gateway_pod_serves_chat_streaming_and_embeddings_from_model_pods(served: Installed) -> None:
    api = client(served)
    reply = api.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hello!"}], max_tokens=6)
    assert reply.model == "tiny-a", served.story()
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 6

    chunks = list(
        api.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c for c in chunks if c.choices]
    assert len(deltas) > 2, chunks  # streamed token by token through the gateway pod
    assert deltas[-1].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 8

    vectors = api.embeddings.create(model="embeddings", input=["hello", "a real node"]).data
    assert [len(v.embedding) for v in vectors] == [384, 384]
    assert abs(sum(x * x for x in vectors[0].embedding) - 1.0) < 1e-3  # all-MiniLM-L6-v2 normalises


INTRUDER = "intruder-real"
SERVING_PORT = 8000  # the runtime's "http" port, the one the AIModel's NetworkPolicy admits the gateway to


def _running(c: LocalCluster, namespace: str, selector: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for pod in pods(c, namespace, selector):
            conditions = {x["type"]: x["status"] for x in pod.get("status", {}).get("conditions", [])}
            if pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True":
                return pod
        return None

    return wait_until(f"a Running and Ready pod in {namespace} ({selector})", found, timeout=120, interval=0.5)


def test_only_the_gateway_reaches_a_model_pod_directly(served: Installed) -> None:
    """The AIModel's NetworkPolicy, enforced on the real node (kube-router): the gateway pod reaches tiny-a's
    pod on its serving port, a pod in another namespace does not (not even one wearing the gateway's labels),
    and the gateway keeps serving."""
    from localcluster.realnode import TEST_IMAGE

    c = served.cluster
    policies = c.api("GET", f"/apis/networking.k8s.io/v1/namespaces/{TEAM}/networkpolicies")["items"]
    selected = [p["spec"]["podSelector"]["matchLabels"].get("servlane.dev/model") for p in policies]
    assert "tiny-a" in selected, policies
    model_url = f"http://{_running(c, TEAM, 'servlane.dev/model=tiny-a')['status']['podIP']}:{SERVING_PORT}/v1/models"
    gateway = _running(c, SYSTEM, "app.kubernetes.io/component=gateway")
    assert "tiny-a" in get_in_pod(netns_of(c, gateway["status"]["podIP"]), model_url)  # admitted: right port

    ensure_namespace(c, INTRUDER)
    wait_until(
        "intruder namespace's default ServiceAccount",
        lambda: c.api("GET", f"/api/v1/namespaces/{INTRUDER}/serviceaccounts/default"),
        timeout=60,
        interval=0.5,
        tolerate=lambda exc: isinstance(exc, OSError),
    )
    try:
        for name, labels in (("curious", {"app": "curious"}), ("impostor", dict(GATEWAY_LABELS))):
            c.api(
                "POST",
                f"/api/v1/namespaces/{INTRUDER}/pods",
                {
                    "metadata": {"name": name, "labels": labels},
                    "spec": {
                        "nodeSelector": NODE_SELECTOR,
                        "terminationGracePeriodSeconds": 5,
                        "containers": [{"name": "hello", "image": TEST_IMAGE, "imagePullPolicy": "Never"}],
                    },
                },
            )
            pod = _running(c, INTRUDER, f"{next(iter(labels))}={next(iter(labels.values()))}")
            why = blocked(netns_of(c, pod["status"]["podIP"]), model_url)
            assert why is not None, f"{INTRUDER}/{name} reached {model_url} directly, around the gateway"
            print(f"\n{INTRUDER}/{name} -> {model_url}: {why}")
        reply = client(served).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Still there?"}], max_tokens=4
        )
        assert reply.model == "tiny-a", served.story()
    finally:
        c.api("DELETE", f"/api/v1/namespaces/{INTRUDER}")


def test_a_canary_to_a_second_real_model_is_promoted_under_traffic(served: Installed) -> None:
    apply_model(served, "tiny-b", model_spec("tiny"))
    with Load(served.gateway_url) as load:
        wait_until("traffic answered by tiny-a", lambda: load.only_answered_by("tiny-a", 0, count=5), timeout=60)
        started = time.monotonic()
        served.kube.patch_feature(TEAM, "chat", {"spec": {"model": "tiny-b"}})
        weights: list[int] = []

        def promoted() -> bool:
            s = served.feature()
            if s.get("canaryWeight") and (not weights or weights[-1] != s["canaryWeight"]):
                weights.append(s["canaryWeight"])
            return s.get("phase") == "Stable" and s.get("stableModel") == "tiny-b"

        try:
            wait_until("tiny-b promoted", promoted, timeout=300, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{served.story()}") from None
        promoted_at = time.monotonic()
        wait_until("clients answered by tiny-b only", lambda: load.only_answered_by("tiny-b", promoted_at), 60)
    during = load.answered_since(started)
    served.record(
        "canary promoted (s, requests, failed)",
        [round(promoted_at - started, 1), len(during), sum(1 for o in during if o.error)],
    )
    assert weights[:1] == [50], weights
    assert {o.model for o in during} >= {"tiny-a", "tiny-b"}
    assert [o.error for o in during if o.error] == []  # a healthy rollout loses no request
    analyses = served.feature()["analyses"]
    assert analyses[-1]["verdict"] == "promote"
    assert analyses[-1]["canaryRequests"] >= 5


def _kill_running_runtime(inst: Installed, model: str) -> int:
    """SIGKILLs the model's runtime container on the node (as an OOM kill or a segfault would): returns how
    many it killed. The kubelet restarts it, with a growing back-off."""
    node = inst.cluster.node
    assert node is not None
    killed = 0
    for pod in pods(inst.cluster, TEAM, f"servlane.dev/model={model}"):
        for cs in pod.get("status", {}).get("containerStatuses", []):
            if "running" in cs.get("state", {}) and cs.get("containerID", "").startswith("containerd://"):
                container_id = cs["containerID"].removeprefix("containerd://")
                if node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id).returncode == 0:
                    killed += 1
    return killed


def test_a_canary_whose_runtime_keeps_crashing_is_rolled_back(served: Installed) -> None:
    apply_model(served, "tiny-c", model_spec("tiny"))
    stable = served.feature()["stableModel"]
    with Load(served.gateway_url) as load:
        wait_until(f"traffic answered by {stable}", lambda: load.only_answered_by(stable, 0, count=5), timeout=60)
        served.kube.patch_feature(TEAM, "chat", {"spec": {"model": "tiny-c"}})
        wait_until("tiny-c takes a share", lambda: any(o.model == "tiny-c" for o in load.snapshot()), timeout=120)
        crashed_at = time.monotonic()
        kills = 0

        def rolled_back() -> dict[str, Any] | None:
            nonlocal kills
            kills += _kill_running_runtime(served, "tiny-c")  # a crash loop: killed whenever it is back
            s = served.feature()
            return s if s.get("phase") == "RolledBack" else None

        try:
            final = wait_until("tiny-c rolled back", rolled_back, timeout=300, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{served.story()}") from None
        rolled_back_at = time.monotonic()
        wait_until(f"clients answered by {stable} only", lambda: load.only_answered_by(stable, rolled_back_at), 60)
        stable_at = time.monotonic()
    after_crash = load.answered_since(crashed_at)
    failed = [o for o in after_crash if o.error]
    served.record(
        "crashing canary: s to RolledBack, s to clients on stable, requests, failed, kills",
        [round(rolled_back_at - crashed_at, 1), round(stable_at - crashed_at, 1), len(after_crash), len(failed), kills],
    )
    # Which check rolled it back: the canary's own word (not Ready, RuntimeCrashLoop) or its window's errors.
    served.record("crashing canary: the rollback's reason", final["analyses"][-1]["message"])
    assert kills >= 1
    assert final["weights"] == [{"model": stable, "weight": 100}], final
    assert final["rolledBackModel"] == "tiny-c"


def test_helm_uninstall_before_the_custom_resources_leaves_nothing_running(served: Installed) -> None:
    c = served.cluster
    served.helm_run("uninstall", RELEASE, "--wait", "--timeout", "120s")
    # The operator is gone: deleting our custom resources must not wait for it (no finalizer of ours).
    started = time.monotonic()
    for kind, plural in (("AIFeature", "aifeatures"), ("AIModel", "aimodels")):
        for item in c.api("GET", f"/apis/servlane.dev/v1alpha1/namespaces/{TEAM}/{plural}")["items"]:
            assert not item["metadata"].get("finalizers"), (kind, item["metadata"])
            c.api("DELETE", f"/apis/servlane.dev/v1alpha1/namespaces/{TEAM}/{plural}/{item['metadata']['name']}")

    def no_custom_resources() -> bool:
        plurals = ("aifeatures", "aimodels")
        return all(not c.api("GET", f"/apis/servlane.dev/v1alpha1/namespaces/{TEAM}/{p}")["items"] for p in plurals)

    wait_until("AIFeatures and AIModels gone", no_custom_resources, timeout=10, interval=0.2)
    served.record("custom resources deleted without the operator (s)", round(time.monotonic() - started, 1))
    # Their children go by garbage collection (owner references), and with them every pod.
    wait_until("no pods left in the team namespace", lambda: not pods(c, TEAM, ""), timeout=180, interval=1)
    wait_until("no pods left in the release namespace", lambda: not pods(c, SYSTEM, ""), timeout=120, interval=1)
    leftovers = {
        path: [i["metadata"]["name"] for i in c.api("GET", path)["items"]]
        for path in (
            f"/apis/apps/v1/namespaces/{TEAM}/deployments",
            f"/apis/apps/v1/namespaces/{SYSTEM}/deployments",
            f"/api/v1/namespaces/{SYSTEM}/services",
            f"/api/v1/namespaces/{SYSTEM}/secrets",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TEAM}/roles",
        )
    }
    assert {k: v for k, v in leftovers.items() if v} == {}
    services = [s["metadata"]["name"] for s in c.api("GET", f"/api/v1/namespaces/{TEAM}/services")["items"]]
    assert services == []
    node = c.node
    assert node is not None
    wait_until(
        "no container of ours left on the node",
        lambda: not any(img in node.ctr("containers", "ls").stdout for img in (RUNTIME_CPU_IMAGE, OPERATOR_IMAGE)),
        timeout=60,
        interval=0.5,
    )

    def gateway_closed() -> bool:
        try:
            answers_200(served.gateway_url + "/models")
        except OSError:  # refused: kube-proxy dropped the NodePort with the Service
            return True
        return False

    wait_until("the gateway's NodePort closed", gateway_closed, timeout=60, interval=0.5)
