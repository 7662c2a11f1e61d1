"""The vLLM engine of our CPU runtime image in a real-node pod, at the shipped defaults (issue #29, item 3).

An AIModel with `engine: vllm`, a memory limit and nothing else set by hand (no env, no extra args, no
engineOptions: the runtime sizes the KV cache from the limit and runs vLLM eager) must become Ready and serve
every request option the runtime accepts (tests/support/request_options.py) through its Service ClusterIP, and no
request may take the engine down: the container never restarts. And an engine that fails inside vLLM's engine
core at start (a KV cache larger than the machine) says vLLM's own reason in the AIModel's Ready condition and
the pod's termination message, not "Engine core initialization failed. See root cause above".

Needs the real node (root, the node's binaries, our images; see e2e/test_real_pods.py, which this module
follows); part of `make test`, SERVLANE_REAL_NODE=0 opts out. The apply -> Ready time is printed.
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
NAMESPACE = "real-vllm-e2e"
CLAIM = "tiny-tools-model"
FOLDER = "tiny-llama-tools"
# The served name the shared checks ask for (tests/request_options.MODEL).
MODEL = request_options.MODEL
# vLLM's start on 2 shared cores (imports, weights, KV cache) after the image's cold first start.
READY_DEADLINE_SECONDS = 600
# The engine core fails after vLLM is imported and the weights are loaded: about as long as a start.
FAILURE_DEADLINE_SECONDS = 420
# Far more than the machine has, within what the API allows (engineOptions.cpuKVCacheGiB <= 4096): vLLM's
# engine core refuses to allocate it.
IMPOSSIBLE_KV_CACHE_GIB = 4096
# What the tiny model needs with vLLM's processes (the runtime sizes the KV cache to fit next to them).
MEMORY = "4Gi"


@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster, real_node_images: list[str]) -> LocalCluster:
    assert RUNTIME_IMAGE in real_node_images
    return real_cluster


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    return real_node_kube(cluster, NAMESPACE)


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: Kube) -> Iterator[OperatorProcess]:
    with operator_process(cluster, kube, "operator-vllm") as process:
        yield process


@pytest.fixture(scope="module")
def model_claim(cluster: LocalCluster, kube: Kube, tools_model_dir: Path) -> str:
    """A claim holding the tiny Llama with the tool-capable template (tests/support/tool_model.py)."""
    local_model_claim(cluster, NAMESPACE, CLAIM, {FOLDER: tools_model_dir})
    return FOLDER


def vllm_model(folder: str, cpu: str = "1500m", **extra: Any) -> dict[str, Any]:
    """`engine: vllm` on the CPU image with a memory limit: what a user writes, nothing set by hand."""
    return {
        "source": {"uri": f"pvc://{CLAIM}/{folder}"},
        "engine": "vllm",
        "resources": {"gpus": 0, "cpu": cpu, "memory": MEMORY},
        "scheduling": {"nodeSelector": NODE_SELECTOR},
        "replicas": 1,
        **extra,
    }


@contextmanager
def model(c: LocalCluster, kube: Kube, name: str, spec: dict[str, Any]) -> Iterator[None]:
    """The AIModel applied, and deleted with its pods afterwards, whatever the test found: the next test needs
    the node's CPUs."""
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


def describe(c: LocalCluster, model: str) -> str:
    return describe_model(c, NAMESPACE, model)


def test_vllm_at_shipped_defaults_serves_every_request_option(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: str
) -> None:
    c = cluster
    rollout = ModelRollout(c, kube, NAMESPACE, MODEL)
    with model(c, kube, MODEL, vllm_model(model_claim)):
        ready = rollout.wait_ready(READY_DEADLINE_SECONDS)  # fails at once if a container exits on the way
        print(f"\nvLLM at the shipped defaults, apply -> {rollout.timings()}")
        pod = rollout.pod
        assert pod["spec"]["nodeName"] == NODE, describe(c, MODEL)
        (container,) = pod["spec"]["containers"]
        assert container["image"] == RUNTIME_IMAGE
        assert container["resources"]["limits"]["memory"] == MEMORY
        # Nothing by hand: no VLLM_* variable in the pod, no engine options or arguments in the spec.
        assert not [e["name"] for e in container.get("env", []) if e["name"].startswith("VLLM_")], container["env"]
        assert not ready["spec"].get("engineOptions", {}).get("extraArgs"), ready["spec"]
        assert ready["spec"].get("env") in (None, []), ready["spec"]
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
            # Still serving after all of them.
            reply = client.chat.completions.create(model=MODEL, messages=request_options.HELLO, max_tokens=4)
            assert reply.usage is not None
            assert reply.usage.completion_tokens > 0
        finally:
            client.close()
        print(f"every request option answered in {time.monotonic() - started:.0f}s")

        # The first container all along: no request took the engine down, no probe restarted it.
        now = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
        assert [cs["restartCount"] for cs in now["status"]["containerStatuses"]] == [0], describe(c, MODEL)


def test_a_failed_engine_start_says_vllms_own_reason(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, model_claim: str
) -> None:
    """A KV cache vLLM's engine core cannot allocate: the AIModel's Ready condition and the pod's termination
    message carry vLLM's own line (the GiB it could not have), not its "See root cause above"."""
    c, name = cluster, "vllm-no-room"
    spec = vllm_model(model_claim, cpu="500m", engineOptions={"cpuKVCacheGiB": IMPOSSIBLE_KV_CACHE_GIB})
    vllms_words = f"{IMPOSSIBLE_KV_CACHE_GIB}.0 GiB"  # vLLM: "... less than requested memory for kv (4096.0 GiB)"

    def reported() -> dict[str, Any] | None:
        status = kube.get_model(NAMESPACE, name).get("status") or {}
        ready = {x["type"]: x for x in status.get("conditions", [])}.get("Ready") or {}
        return status if vllms_words in (ready.get("message") or "") else None

    with model(c, kube, name, spec):
        started = time.monotonic()
        try:
            status = wait_until("the AIModel says vLLM's reason", reported, FAILURE_DEADLINE_SECONDS, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe(c, name)}") from None
        print(f"\nvLLM's start failure on the AIModel after {time.monotonic() - started:.0f}s")
        ready = {x["type"]: x for x in status["conditions"]}["Ready"]
        print(f"Ready condition: {json.dumps(ready, indent=1)}")
        assert ready["status"] == "False", status
        assert ready["reason"] == "ModelLoadFailed", ready
        assert "vLLM's engine core failed to start" in ready["message"], ready
        assert "See root cause above" not in ready["message"], ready
        assert status.get("phase") != "Ready", status

        (pod,) = pods(c, NAMESPACE, f"servlane.dev/model={name}")
        (runtime,) = pod["status"]["containerStatuses"]
        terminated = runtime["state"].get("terminated") or runtime.get("lastState", {}).get("terminated") or {}
        message = terminated.get("message") or ""
        assert vllms_words in message, describe(c, name)
        assert "Engine core initialization failed" not in message, message
        assert "\n" not in message.strip()  # the runtime's one line, not FallbackToLogsOnError's log tail
