"""The llama.cpp engine of our CPU runtime image in a real-node pod, from a `pvc://` source holding a GGUF file.

An AIModel with `engine: llamacpp` and a CPU and memory limit must become Ready and serve every request option the
runtime accepts (tests/support/request_options.py) through its Service ClusterIP, decoding with the threads its CPU
limit gives (no request takes the engine down: the container never restarts). A file that is not GGUF is named on
the AIModel (ModelLoadFailed) with the runtime's reason.

Needs the real node (root, the node's binaries, our images; see e2e/test_real_pods.py, which this module follows);
part of `make test`, SERVLANE_REAL_NODE=0 opts out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from localcluster.cluster import LocalCluster
from servlane_devtools.tiny_model import convert_to_gguf
from tests.support import request_options, tool_model
from tests.support.cluster_harness import RUNTIME_CPU_IMAGE as RUNTIME_IMAGE
from tests.support.cluster_harness import Kube, OperatorProcess
from tests.support.polling import wait_until
from tests.support.real_pods import (
    NODE,
    NODE_SELECTOR,
    ModelRollout,
    describe_model,
    local_model_claim,
    operator_process,
    pods,
    real_node_kube,
    service_base_url,
)

pytestmark = [
    pytest.mark.e2e,
    # A session that starts here brings the cluster up and imports a 7 GB image first.
    pytest.mark.timeout(1800),
]

tools_model_dir = tool_model.tools_model_dir
NAMESPACE = "real-llamacpp-e2e"
CLAIM = "gguf-models"
MODEL = request_options.MODEL  # the served name the shared checks ask for
READY_DEADLINE_SECONDS = 300
FAILURE_DEADLINE_SECONDS = 180


@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster, real_node_images: list[str]) -> LocalCluster:
    assert RUNTIME_IMAGE in real_node_images
    return real_cluster


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    return real_node_kube(cluster, NAMESPACE)


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: Kube) -> Iterator[OperatorProcess]:
    with operator_process(cluster, kube, "operator-llamacpp") as process:
        yield process


@pytest.fixture(scope="module")
def model_claim(cluster: LocalCluster, tools_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A claim with two folders: `tools` (the tool-capable tiny Llama as GGUF) and `not-gguf` (a file named
    model.gguf that is a zip)."""
    root = tmp_path_factory.mktemp("gguf-claim")
    (root / "tools").mkdir()
    convert_to_gguf(tools_model_dir, root / "tools" / "model.gguf")
    (root / "not-gguf").mkdir()
    (root / "not-gguf" / "model.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF file")
    local_model_claim(cluster, NAMESPACE, CLAIM, {"tools": root / "tools", "not-gguf": root / "not-gguf"})


def llamacpp_model(folder: str, **extra: Any) -> dict[str, Any]:
    return {
        "source": {"uri": f"pvc://{CLAIM}/{folder}"},
        "engine": "llamacpp",
        "engineOptions": {"maxModelLen": 2048},  # the tools template lists the tools: ~750 tokens
        "resources": {"gpus": 0, "cpu": "1500m", "memory": "2Gi"},
        "scheduling": {"nodeSelector": NODE_SELECTOR},
        "replicas": 1,
        **extra,
    }


@contextmanager
def model(c: LocalCluster, kube: Kube, name: str, spec: dict[str, Any]) -> Iterator[None]:
    kube.create_model(NAMESPACE, name, spec)
    try:
        yield
    finally:
        kube.delete_model(NAMESPACE, name)
        wait_until(
            f"{name}'s pods deleted",
            lambda: not pods(c, NAMESPACE, f"servlane.dev/model={name}"),
            timeout=180,
            interval=0.5,
        )


def describe(c: LocalCluster, name: str) -> str:
    return describe_model(c, NAMESPACE, name)


def test_a_gguf_model_on_a_claim_serves_every_request_option(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: None
) -> None:
    c = cluster
    rollout = ModelRollout(c, kube, NAMESPACE, MODEL)
    with model(c, kube, MODEL, llamacpp_model("tools")):
        ready = rollout.wait_ready(READY_DEADLINE_SECONDS)
        print(f"\nllama.cpp engine, apply -> {rollout.timings()}")
        pod = rollout.pod
        assert pod["spec"]["nodeName"] == NODE, describe(c, MODEL)
        (container,) = pod["spec"]["containers"]
        assert container["image"] == RUNTIME_IMAGE
        config = json.loads(next(e["value"] for e in container["env"] if e["name"] == "SERVLANE_RUNTIME_CONFIG"))
        assert (config["engine"], config["llamacpp"]["threads"]) == ("llamacpp", 1)  # 1500m: one whole CPU
        assert {x["type"]: x["status"] for x in ready["status"]["conditions"]}["Ready"] == "True", ready["status"]

        base = service_base_url(c, NAMESPACE, MODEL)
        http = openai.DefaultHttpxClient(trust_env=False, timeout=300)  # a ClusterIP: never through a proxy
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
        started = time.monotonic()
        try:
            assert [m.id for m in client.models.list().data] == [MODEL], describe(c, MODEL)
            try:
                request_options.check_every_option(client, base)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{describe(c, MODEL)}") from exc
        finally:
            client.close()
        print(f"every request option answered in {time.monotonic() - started:.0f}s")
        now = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
        assert [cs["restartCount"] for cs in now["status"]["containerStatuses"]] == [0], describe(c, MODEL)


def test_a_file_that_is_not_gguf_is_named_on_the_aimodel(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: None
) -> None:
    c, name = cluster, "not-gguf"

    def reported() -> dict[str, Any] | None:
        status = kube.get_model(NAMESPACE, name).get("status") or {}
        ready = {x["type"]: x for x in status.get("conditions", [])}.get("Ready") or {}
        return ready if "is not a GGUF file" in (ready.get("message") or "") else None

    with model(c, kube, name, llamacpp_model("not-gguf")):
        try:
            ready = wait_until("the AIModel names the file", reported, FAILURE_DEADLINE_SECONDS, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe(c, name)}") from None
        assert (ready["status"], ready["reason"]) == ("False", "ModelLoadFailed"), ready
