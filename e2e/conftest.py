"""Session fixtures for e2e tests: the local control plane (or $E2E_KUBECONFIG), the CRDs, the operator."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from pluggy import Result

from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import (
    ARTIFACTS,
    GATEWAY_IMAGE,
    OPERATOR_IMAGE,
    RUNTIME_CPU_IMAGE,
    Kube,
    OperatorProcess,
    dump_namespace,
    install_crds,
    namespace_body,
    operator_rbac,
    service_account_kubeconfig,
    unavailable,
)
from tests.support.gateway_endpoint import GatewayMetrics, serve_gateway_metrics

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    existing = os.environ.get("E2E_KUBECONFIG")
    if existing:
        yield Kube(Path(existing))
        return
    if not os.environ.get("KUBEBUILDER_ASSETS") and shutil.which("go") is None:
        unavailable("no Go toolchain to build the local control plane (and no KUBEBUILDER_ASSETS, no E2E_KUBECONFIG)")
    workdir = ARTIFACTS / f"cluster-{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(workdir)
    cluster.up()
    try:
        yield Kube(cluster.kubeconfig)
    finally:
        cluster.down()
        # Logs stay for a failed run; a passing session leaves nothing behind.
        if not getattr(kube, "failed", False):
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A second local cluster whose worker is a real node (kubelet, containerd, runc, CNI, kube-proxy): pods run.
    Shared by e2e/test_real_*.py. Part of `make test`; a missing prerequisite (root, the node binaries that
    setup.sh builds, our Docker images) skips here and fails in CI. SERVLANE_REAL_NODE=0 opts out locally."""
    if os.environ.get("SERVLANE_REAL_NODE") == "0":
        pytest.skip("SERVLANE_REAL_NODE=0: the real-node suites are switched off")
    from localcluster.realnode import missing_prerequisites

    missing = missing_prerequisites()
    if missing:
        unavailable("a real node needs: " + "; ".join(missing))
    workdir = ARTIFACTS / f"cluster-real-{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(workdir, real_node=True, real_node_kube_proxy=True)
    failures = request.session.testsfailed
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()
        if request.session.testsfailed == failures:
            shutil.rmtree(workdir, ignore_errors=True)
        else:  # the logs stay for a failed run, not the multi-GB containerd store
            shutil.rmtree(workdir / "real-node" / "containerd", ignore_errors=True)


@pytest.fixture(scope="session")
def real_node_images(real_cluster: LocalCluster) -> Iterator[list[str]]:
    """Our images (built by scripts/build-images.sh), imported once from Docker into the real node's containerd:
    there is no registry, so pods run them with imagePullPolicy IfNotPresent. Removed at the end (~8 GB unpacked)."""
    node = real_cluster.node
    assert node is not None
    if shutil.which("docker") is None:
        unavailable("docker (our images are imported from it)")
    images = [RUNTIME_CPU_IMAGE, OPERATOR_IMAGE, GATEWAY_IMAGE]
    for ref in images:
        inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
        if inspect.returncode != 0:
            unavailable(f"{ref} is not built (scripts/build-images.sh all)")
    free = shutil.disk_usage(node.workdir).free
    if free < MIN_FREE_BYTES_FOR_IMAGES:
        unavailable(
            f"only {free / 1024**3:.1f} GiB free under {node.workdir}; importing our images needs"
            f" {MIN_FREE_BYTES_FOR_IMAGES / 1024**3:.0f} GiB (`docker system df` shows what Docker holds)"
        )
    for ref in images:
        seconds = node.import_docker_image(ref, timeout=1200)
        print(f"\nimported {ref} into {node.name}'s containerd in {seconds:.0f}s")
    try:
        yield images
    finally:
        for ref in images:
            node.remove_image(ref)


# The unpacked runtime image (~7.2 GB; the import peaks near twice that) plus the small ones and room for logs.
MIN_FREE_BYTES_FOR_IMAGES = 16 * 1024**3


@pytest.fixture(scope="session")
def crds(kube: Kube) -> Kube:
    install_crds(kube)
    return kube


@pytest.fixture(scope="session")
def gateway_metrics() -> Iterator[GatewayMetrics]:
    """A gateway-contract /metrics endpoint the tests drive; the operator's canary analysis scrapes it."""
    yield from serve_gateway_metrics()


@pytest.fixture(scope="session")
def operator(crds: Kube, gateway_metrics: GatewayMetrics) -> Iterator[OperatorProcess]:
    operator_rbac(crds)
    ARTIFACTS.mkdir(exist_ok=True)
    kubeconfig = service_account_kubeconfig(crds, ARTIFACTS / "operator-sa.kubeconfig")
    env = {"SERVLANE_GATEWAY_METRICS_URLS": gateway_metrics.url, "SERVLANE_ANALYSIS_INTERVAL_SECONDS": "0.5"}
    process = OperatorProcess(kubeconfig, ARTIFACTS / "operator.log", extra_env=env)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def paused_operator(operator: OperatorProcess) -> Iterator[None]:
    """The operator stopped for one test (which writes statuses itself), started again after it."""
    operator.stop()
    try:
        yield
    finally:
        operator.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed
        if report.failed:
            kube.failed = True  # type: ignore[attr-defined]


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, crds: Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    crds.core.create_namespace(namespace_body(name))
    yield name
    if request.node.stash.get(_FAILED, False):
        dump_namespace(crds, name, ARTIFACTS / "dumps" / request.node.name)
    crds.core.delete_namespace(name)
