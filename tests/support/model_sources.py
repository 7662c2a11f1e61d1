"""Models from every source on the real node: the namespace, the cluster with its CRDs, the operator under its
ServiceAccount (module fixtures), and a Hugging Face cache seeded from a local model folder."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import (
    RUNTIME_CPU_IMAGE,
    Kube,
    OperatorProcess,
)
from tests.support.real_pods import (
    operator_process,
    real_node_kube,
)

NAMESPACE = "model-sources-e2e"


@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster, real_node_images: list[str]) -> LocalCluster:
    assert RUNTIME_CPU_IMAGE in real_node_images
    return real_cluster


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    return real_node_kube(cluster, NAMESPACE)


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: Kube) -> Iterator[OperatorProcess]:
    with operator_process(cluster, kube, "operator") as process:
        yield process


RUNTIME_UID = 10001  # the runtime image's user: a cache volume is its to write


def seed_hub_cache(root: Path, repo_id: str, model: Path) -> Path:
    """What `huggingface-cli download <repo_id> --cache-dir <root>` leaves: each file a blob named by its digest,
    the snapshot of a commit made of relative links to the blobs, refs/main naming the commit. Returns the
    snapshot's path relative to `root`."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    files = sorted(p for p in model.iterdir() if p.is_file())
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    for p in files:
        shutil.copyfile(p, repo / "blobs" / digests[p.name])
        (snapshot / p.name).symlink_to(Path("..") / ".." / "blobs" / digests[p.name])
    (repo / "refs" / "main").write_text(commit)
    return snapshot.relative_to(root)
