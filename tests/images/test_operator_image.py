"""The operator image: its entrypoint runs (`--help`), it holds kopf and our handlers but no ML library, and,
against the local control plane (localcluster/, as the e2e tests use it), it starts under a read-only root as
uid 10001 with the operator's ServiceAccount kubeconfig, reports healthy on its kopf liveness endpoint, and
reconciles an AIModel into a Deployment that runs the CPU runtime image."""

from __future__ import annotations

import base64
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servlane_operator.settings import OperatorSettings
from tests.images.harness import Container, built_image, docker, docker_ok, python_in, unavailable
from tests.support.polling import wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def operator_image() -> str:
    return built_image("operator")


def test_entrypoint_help(operator_image: str) -> None:
    done = docker("run", "--rm", "--read-only", operator_image, "--help")
    assert done.returncode == 0, done.stderr
    assert "servlane-operator" in done.stdout
    assert "--liveness" in done.stdout


def test_imports_kopf_and_handlers_without_ml_libraries(operator_image: str) -> None:
    code = (
        "import importlib.util, os, kopf, servlane_operator.handlers\n"
        "print(os.getuid(), [m for m in ('torch', 'transformers', 'vllm') if importlib.util.find_spec(m)])\n"
    )
    assert python_in(operator_image, code).split() == ["10001", "[]"]


def test_invalid_settings_exit_2_with_one_line(operator_image: str) -> None:
    done = docker("run", "--rm", "--read-only", "--env", "SERVLANE_RUNTIME_IMAGE=x", operator_image)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SERVLANE_RUNTIME_IMAGE is no longer supported" in done.stderr


@pytest.fixture(scope="module")
def cluster_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """(admin Kube, a self-contained ServiceAccount kubeconfig for the operator) on a fresh local control plane."""
    if not os.environ.get("KUBEBUILDER_ASSETS") and shutil.which("go") is None:
        unavailable("no Go toolchain to build the local control plane (and no KUBEBUILDER_ASSETS)")
    from localcluster.cluster import LocalCluster
    from tests.support.cluster_harness import Kube, install_crds, operator_rbac, service_account_kubeconfig

    workdir = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster(workdir)
    cluster.up()
    try:
        kube = Kube(cluster.kubeconfig)
        install_crds(kube)
        operator_rbac(kube)
        path = service_account_kubeconfig(kube, workdir / "operator-sa.json")
        # Inline the CA: the container sees only this one file.
        doc = json.loads(path.read_text())
        ca_file = doc["clusters"][0]["cluster"].pop("certificate-authority")
        doc["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
            Path(ca_file).read_bytes()
        ).decode()
        path.write_text(json.dumps(doc))
        path.chmod(0o644)
        yield kube, path
    finally:
        cluster.down()


def test_runs_against_the_control_plane_and_reconciles(
    operator_image: str, cluster_kubeconfig: tuple[Any, Path]
) -> None:
    kube, kubeconfig = cluster_kubeconfig
    health, metrics = free_port(), free_port()
    options = [
        "--network=host",  # the local API server listens on the host's loopback
        # The chart's uid, which has no passwd entry in the image (as OpenShift's random uids have none):
        # the operator must not need one (kopf's default peering identity did, and crashed on a real pod).
        "--user=65532:65532",
        "--read-only",
        "--mount=type=tmpfs,destination=/tmp,tmpfs-mode=1777",  # the chart's emptyDir
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--mount",
        f"type=bind,source={kubeconfig},destination=/etc/servlane/kubeconfig,readonly",
        "--env=KUBECONFIG=/etc/servlane/kubeconfig",
        f"--env=SERVLANE_METRICS_PORT={metrics}",
        "--env=SERVLANE_RESYNC_SECONDS=3",
        "--env=SERVLANE_GATEWAY_NAMESPACE=servlane-system",  # required: the gateway is trusted only there
    ]
    args = ["--log-format", "full", "--liveness", f"http://127.0.0.1:{health}/healthz"]
    with Container(operator_image, options, args) as container:
        container.wait_http_ok(f"http://127.0.0.1:{health}/healthz", 120, "the operator's liveness endpoint")
        container.wait_http_ok(f"http://127.0.0.1:{metrics}/metrics", 30, "the operator's metrics")

        from tests.support.cluster_harness import namespace_body

        namespace = f"images-{uuid.uuid4().hex[:6]}"
        kube.core.create_namespace(namespace_body(namespace))
        kube.create_object("AIModel", namespace, "tiny", {"source": {"uri": "/models/tiny"}, "engine": "vllm"})

        def deployment_image() -> str | None:
            container.assert_running("reconciling an AIModel")
            found = kube.apps.list_namespaced_deployment(namespace).items
            return str(found[0].spec.template.spec.containers[0].image) if found else None

        try:
            image = wait_until("the AIModel's Deployment", deployment_image, 60, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{container.logs()}") from None
        # The image's operator uses its default settings: a CPU model runs the CPU runtime image.
        assert image == OperatorSettings.from_env({}).runtime_image_cpu
        assert docker_ok("inspect", "--format", "{{.State.Running}}", container.name).strip() == "true"
