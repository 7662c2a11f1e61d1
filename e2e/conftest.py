"""Session fixtures for e2e tests: the local control plane (or $E2E_KUBECONFIG), the CRDs, the operator."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from pluggy import Result

from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import (
    ARTIFACTS,
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
from tests.support.real_node import MIN_FREE_BYTES_FOR_IMAGES, real_cluster, real_node_images  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    """The session's local control plane with KWOK nodes; None when the tests run against $E2E_KUBECONFIG."""
    if os.environ.get("E2E_KUBECONFIG"):
        yield None
        return
    if not os.environ.get("KUBEBUILDER_ASSETS") and shutil.which("go") is None:
        unavailable("no Go toolchain to build the local control plane (and no KUBEBUILDER_ASSETS, no E2E_KUBECONFIG)")
    workdir = ARTIFACTS / f"cluster-{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(workdir)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()
        # Logs stay for a failed run; a passing session leaves nothing behind.
        if not getattr(kube, "failed", False):
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster | None) -> Kube:
    if local_cluster is None:
        return Kube(Path(os.environ["E2E_KUBECONFIG"]))
    return Kube(local_cluster.kubeconfig)


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
