"""The chart's optional settings, all on at once, against the shipped images on the real node (e2e/conftest.py
`real_cluster`): tracing to an OTLP collector that is not there (yet), API keys, the console, two gateway
worker processes and the NetworkPolicies. Each of these makes the gateway import or start something that the
default install never does, so only a pod that runs the image with them on shows that the image has what they
need: `tracing.enabled: true` once crash-looped the gateway pod, whose image lacked the OpenTelemetry SDK.

Its own release and namespaces, installed and uninstalled here, so it runs beside e2e/test_real_helm.py.
Not covered here: the Batch API with PostgreSQL and limits/cache in Redis (they need those servers in the
cluster); tests/images/test_gateway_image.py checks their modules are in the image.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.harness import ARTIFACTS, GATEWAY_IMAGE, OPERATOR_IMAGE, RUNTIME_CPU_IMAGE
from e2e.real_pods import NODE, NODE_SELECTOR, describe_pods, ensure_namespace, pod_log, pods
from localcluster.cluster import LocalCluster
from tests.helm.helmtool import CHART, Helm, HelmUnavailable, find_helm
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

RELEASE, SYSTEM, TEAM = "servlane-toggles", "servlane-toggles-system", "team-toggles"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
ABSENT_COLLECTOR = "http://otel-collector.observability.svc.cluster.local:4318"  # no such Service


def toggles_values(key_digest: str) -> dict[str, Any]:
    on_real_node = {"nodeSelector": NODE_SELECTOR}
    return {
        "operator": {"watchNamespaces": [TEAM], **on_real_node},
        "gateway": {
            "replicaCount": 1,
            "workers": 2,
            "service": {"type": "NodePort"},
            "podDisruptionBudget": {"enabled": False},
            "console": {"enabled": True},
            "apiKeys": {"entries": [{"name": "team-toggles", "key": key_digest}]},
            **on_real_node,
        },
        "tracing": {"enabled": True, "otlpEndpoint": ABSENT_COLLECTOR, "samplingRatio": 1.0},
        "networkPolicy": {"enabled": True},
    }


class Toggled:
    def __init__(self, cluster: LocalCluster, helm: Helm, key: str) -> None:
        self.cluster, self.helm, self.key = cluster, helm, key
        self.base = ""  # http://127.0.0.1:<nodePort>

    def helm_run(self, *args: str) -> str:
        return self.helm.run(*args, "--namespace", SYSTEM, kubeconfig=self.cluster.kubeconfig).stdout

    def story(self) -> str:
        return describe_pods(self.cluster, SYSTEM, SELECTOR)

    def get(self, path: str, key: str | None = None) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(self.base + path)
        if key is not None:
            request.add_header("Authorization", f"Bearer {key}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the host's proxy is not the way in
        try:
            with opener.open(request, timeout=20) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)


@pytest.fixture(scope="module")
def toggled(real_cluster: LocalCluster, real_node_images: list[str]) -> Iterator[Toggled]:
    assert {RUNTIME_CPU_IMAGE, OPERATOR_IMAGE, GATEWAY_IMAGE} <= set(real_node_images)
    try:
        helm = Helm(find_helm())
    except HelmUnavailable as exc:
        pytest.fail(f"helm is built with the control plane, so it must be there: {exc}")
    key = "sk-" + secrets.token_hex(16)
    inst = Toggled(real_cluster, helm, key)
    ensure_namespace(real_cluster, TEAM)
    values_file = ARTIFACTS / "real-helm-toggles-values.yaml"
    digest = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    values_file.write_text(yaml.safe_dump(toggles_values(digest)))
    started = time.monotonic()
    try:
        inst.helm_run(
            "install", RELEASE, str(CHART), "--create-namespace", "--values", str(values_file),
            "--wait", "--timeout", "300s",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{inst.story()}") from None
    print(f"\nhelm install --wait with every toggle on: {time.monotonic() - started:.1f}s")
    service = real_cluster.api("GET", f"/api/v1/namespaces/{SYSTEM}/services/{RELEASE}-gateway")
    inst.base = f"http://127.0.0.1:{service['spec']['ports'][0]['nodePort']}"
    try:
        yield inst
    finally:
        helm.run("uninstall", RELEASE, "-n", SYSTEM, "--ignore-not-found", kubeconfig=real_cluster.kubeconfig)


def test_every_pod_runs_without_a_restart(toggled: Toggled) -> None:
    found = pods(toggled.cluster, SYSTEM, SELECTOR)
    assert {p["spec"]["containers"][0]["image"] for p in found} == {OPERATOR_IMAGE, GATEWAY_IMAGE}, toggled.story()
    for pod in found:
        assert pod["spec"]["nodeName"] == NODE
        statuses = pod["status"]["containerStatuses"]
        assert all(cs["ready"] and cs["restartCount"] == 0 for cs in statuses), toggled.story()


def test_the_gateway_serves_with_tracing_keys_console_and_two_workers(toggled: Toggled) -> None:
    wait_until(
        "the gateway's /health through its NodePort",
        lambda: toggled.get("/health")[0] == 200,
        timeout=60,
        interval=1,
        tolerate=lambda exc: isinstance(exc, OSError),
    )
    assert toggled.get("/v1/models")[0] == 401, "API keys are configured: no key, no models"
    status, headers = toggled.get("/v1/models", toggled.key)
    assert status == 200, toggled.story()
    lowered = {k.lower(): v for k, v in headers.items()}
    assert len(lowered.get("x-trace-id", "")) == 32, f"no trace id with tracing on: {headers}"
    assert toggled.get("/console/api/state", toggled.key)[0] == 200, toggled.story()
    (gateway,) = pods(toggled.cluster, SYSTEM, f"{SELECTOR},app.kubernetes.io/component=gateway")
    log = pod_log(toggled.cluster, SYSTEM, gateway["metadata"]["name"], "gateway")
    assert "tracing on" in log, log  # the exporter's failures to reach the absent collector are only logged


def test_the_network_policies_are_installed(toggled: Toggled) -> None:
    found = toggled.cluster.api("GET", f"/apis/networking.k8s.io/v1/namespaces/{SYSTEM}/networkpolicies")["items"]
    names = sorted(p["metadata"]["name"] for p in found)
    assert names == sorted([f"{RELEASE}-gateway", f"{RELEASE}-operator"]), names
