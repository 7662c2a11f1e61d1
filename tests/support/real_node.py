"""The local cluster whose worker is a real node (kubelet, containerd), and our images imported into it: session
fixtures for e2e/test_real_*.py (through e2e/conftest.py) and the real-node benchmarks."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import (
    ARTIFACTS,
    GATEWAY_IMAGE,
    OPERATOR_IMAGE,
    RUNTIME_CPU_IMAGE,
    unavailable,
)


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
    there is no registry, so pods run them with imagePullPolicy IfNotPresent. Linked from Docker's layers where
    they can be (no disk used), else copied (~8 GB unpacked, nearly twice that while importing). Removed at the
    end."""
    node = real_cluster.node
    assert node is not None
    if shutil.which("docker") is None:
        unavailable("docker (our images are imported from it)")
    images = [RUNTIME_CPU_IMAGE, OPERATOR_IMAGE, GATEWAY_IMAGE]
    for ref in images:
        inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
        if inspect.returncode != 0:
            unavailable(f"{ref} is not built (scripts/build-images.sh all)")
    copied = [ref for ref in images if node.docker_image_to_link(ref) is None]
    free = shutil.disk_usage(node.workdir).free
    if copied and free < MIN_FREE_BYTES_FOR_IMAGES:
        unavailable(
            f"only {free / 1024**3:.1f} GiB free under {node.workdir}; copying {', '.join(copied)} (not linkable"
            f" from Docker's overlay2 layers on this filesystem) needs {MIN_FREE_BYTES_FOR_IMAGES / 1024**3:.0f} GiB"
            " (`docker system df` shows what Docker holds)"
        )
    for ref in images:
        seconds = node.import_docker_image(ref, timeout=1200)
        print(f"\nimported {ref} into {node.name}'s containerd in {seconds:.0f}s")
    try:
        yield images
    finally:
        for ref in images:
            node.remove_image(ref)


# Copying: the unpacked runtime image (~7.7 GB; the import peaks near twice that), the small ones, room for logs.
MIN_FREE_BYTES_FOR_IMAGES = 16 * 1024**3
