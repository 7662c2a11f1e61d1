"""Model sources on the real node (issue #31): the tiny Llama packaged as an OCI image by scripts/build-model-image.sh,
imported into the node's containerd (no registry here, as our own images) and served from `oci://` as a Kubernetes
image volume, answering the `openai` client through the gateway (`python -m servlane_gateway --watch` on this host, a
feature `chat` in front of the model); an image that does not exist is named on the AIModel (`ModelSourceFailed`, the
kubelet's own words) within 30 s. Times to Ready from each source are bench/model_sources.py's. Root, the real
node's binaries and our images needed (e2e/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from servlane_api.runtime_config import ENV_VAR
from tests.support import model_sources
from tests.support.cluster_harness import (
    ARTIFACTS,
    GROUP,
    VERSION,
    Kube,
    OperatorProcess,
    watching_gateway,
)
from tests.support.model_sources import NAMESPACE
from tests.support.polling import wait_until
from tests.support.real_pods import (
    ModelRollout,
    chat_through_gateway,
    describe_model,
    gone,
    local_model_claim,
    model_on_the_real_node,
    pod_log,
    pods,
)

# The real node's cluster, admin client and operator for these tests (bench/model_sources.py uses them too).
cluster = model_sources.cluster
kube = model_sources.kube
operator = model_sources.operator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

CLAIM = "tiny-models"
ROOT = Path(__file__).resolve().parents[1]
# A registry name that resolves nowhere (.test is reserved): the image is in the node's containerd or nowhere.
MODEL_IMAGE = "registry.servlane.test/models/tiny-llama:e2e"
MISSING_IMAGE = "registry.servlane.test/models/no-such-model:v1"
READY_DEADLINE_SECONDS = 600
# Issue #31: a source that cannot be had is named on the AIModel within 30 s.
NAMED_WITHIN_SECONDS = 30
RESOURCES = {"cpu": "1500m", "memory": "4Gi"}


@pytest.fixture(scope="module")
def gateway(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
    """The gateway as a process on this host, watching the test namespace; its OpenAI base URL."""
    ARTIFACTS.mkdir(exist_ok=True)
    with watching_gateway(kube, "gateway-model-sources.log", "--namespaces", NAMESPACE) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from servlane_devtools.tiny_model import build_tiny_llama

    return build_tiny_llama()


@pytest.fixture(scope="module")
def model_image(cluster: LocalCluster, tiny_model: Path) -> Iterator[str]:
    """The tiny Llama as an OCI image, built by the documented script and imported into the node's containerd."""
    node = cluster.node
    assert node is not None
    started = time.monotonic()
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-model-image.sh"), str(tiny_model), MODEL_IMAGE],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    seconds = node.import_docker_image(MODEL_IMAGE, timeout=300)
    print(f"\nbuilt and imported {MODEL_IMAGE} in {time.monotonic() - started:.1f}s (import {seconds:.1f}s)")
    try:
        yield MODEL_IMAGE
    finally:
        node.remove_image(MODEL_IMAGE)
        subprocess.run(["docker", "rmi", "-f", MODEL_IMAGE], capture_output=True, check=False)


@pytest.fixture(scope="module")
def model_claim(cluster: LocalCluster, kube: Kube, tiny_model: Path) -> str:
    local_model_claim(cluster, NAMESPACE, CLAIM, {tiny_model.name: tiny_model})
    return tiny_model.name


def oci_spec(ref: str, resources: dict[str, str] = RESOURCES) -> dict[str, Any]:
    """The real-pod spec of tests/support/real_pods.py with the weights from an image instead of a claim."""
    spec = model_on_the_real_node(CLAIM, "unused", resources, replicas=1)
    return {**spec, "source": {"uri": f"oci://{ref}"}}


def remove_model(c: LocalCluster, kube: Kube, name: str) -> None:
    kube.delete_model(NAMESPACE, name)
    # preStop sleeps 10 s, then the runtime drains; the grace period allows 100 s.
    paths = [
        f"/api/v1/namespaces/{NAMESPACE}/pods/{p['metadata']['name']}"
        for p in pods(c, NAMESPACE, f"servlane.dev/model={name}")
    ]
    wait_until(f"the pods of {name} deleted", lambda: all(gone(c, path) for path in paths), timeout=180, interval=0.5)


def test_an_oci_model_image_is_mounted_and_served_through_the_gateway(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, gateway: str, model_image: str
) -> None:
    c, name = cluster, "tiny-oci"
    rollout = ModelRollout(c, kube, NAMESPACE, name)
    kube.create_model(NAMESPACE, name, oci_spec(model_image))
    kube.create_feature(NAMESPACE, "chat", {"model": name})
    try:
        serves_from_the_image(c, rollout, gateway, name, model_image)
    finally:
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "aifeatures", "chat")
        remove_model(c, kube, name)


def serves_from_the_image(c: LocalCluster, rollout: ModelRollout, gateway: str, name: str, model_image: str) -> None:
    rollout.wait_ready(READY_DEADLINE_SECONDS)
    print(f"\noci:// apply -> {rollout.timings()}")

    pod = rollout.pod
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model-source"]["image"] == {"reference": model_image, "pullPolicy": "IfNotPresent"}
    # The runtime was given the mount, not a reference to fetch; and the Hub is off (HF_HUB_OFFLINE).
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert json.loads(env[ENV_VAR])["model_source"] == "/mnt/model-image"
    assert env["HF_HUB_OFFLINE"] == "1"

    # Loaded from the mount (the runtime's own log, before any request).
    log = pod_log(c, NAMESPACE, pod["metadata"]["name"])
    assert "loading transformers engine from /mnt/model-image" in log, log

    # The openai client, through the gateway: `chat` is the feature, routed to the pod by the gateway.
    reply = chat_through_gateway(gateway, "chat")
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 8, describe_model(c, NAMESPACE, name)
    assert reply.choices[0].finish_reason in ("stop", "length")
    fresh = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
    assert [cs["restartCount"] for cs in fresh["status"]["containerStatuses"]] == [0]


def test_a_missing_model_image_is_named_on_the_aimodel_within_30_seconds(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess
) -> None:
    c, name = cluster, "missing-oci"
    applied = time.monotonic()
    # It never runs: a small request schedules it whatever else the node holds.
    kube.create_model(NAMESPACE, name, oci_spec(MISSING_IMAGE, {"cpu": "100m", "memory": "256Mi"}))
    try:
        named_within_30_seconds(c, kube, name, applied)
    finally:
        remove_model(c, kube, name)


def named_within_30_seconds(c: LocalCluster, kube: Kube, name: str, applied: float) -> None:
    def named() -> dict[str, Any] | None:
        ready = kube.condition(NAMESPACE, name, "Ready")
        return ready if ready is not None and ready["reason"] == "ModelSourceFailed" else None

    try:
        ready = wait_until("Ready=False ModelSourceFailed", named, timeout=NAMED_WITHIN_SECONDS, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_model(c, NAMESPACE, name)}") from None
    took = time.monotonic() - applied
    print(f"\nmissing image named after {took:.1f}s: {ready['message']}")
    assert ready["status"] == "False"
    assert MISSING_IMAGE in ready["message"]
    assert "the model image cannot be pulled" in ready["message"]
    assert kube.get_model(NAMESPACE, name)["status"]["phase"] == "Degraded"
