"""Deleting an AIModel or AIFeature never waits for the operator: no finalizer (kopf's or ours) is ever on
them, so `kubectl delete`, `helm uninstall` before the CRs, or an Argo CD app deletion complete while the
operator is down; the children still go by garbage collection (ownerReferences)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.cluster_harness import GROUP, PLURALS, VERSION, Kube, OperatorProcess, wait_until

pytestmark = pytest.mark.e2e

DELETE_DEADLINE_SECONDS = 5


@pytest.fixture
def stoppable_operator(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session's operator, started again after a test that stopped it."""
    yield operator
    if operator.proc is None:
        operator.start()


def gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_deleting_our_objects_does_not_wait_for_the_operator(
    crds: Kube, namespace: str, stoppable_operator: OperatorProcess
) -> None:
    crds.create_model(namespace, "m1", {"source": {"uri": "/models/m"}, "engine": "transformers"})
    crds.create_feature(namespace, "f1", {"model": "m1"})
    wait_until("the Deployment of m1", lambda: crds.apps.read_namespaced_deployment("model-m1", namespace))
    # Both have been handled, and kopf settles its finalizer before an object's first handler runs.
    wait_until("m1 reconciled", lambda: (crds.get_model(namespace, "m1").get("status") or {}).get("observedGeneration"))
    wait_until("f1 reconciled", lambda: (crds.get_feature(namespace, "f1").get("status") or {}).get("phase"))
    reads: dict[str, Callable[[], dict[str, object]]] = {
        "AIModel": lambda: crds.get_model(namespace, "m1"),
        "AIFeature": lambda: crds.get_feature(namespace, "f1"),
    }
    for kind, read in reads.items():
        metadata = read()["metadata"]
        assert isinstance(metadata, dict)
        assert metadata.get("finalizers", []) == [], f"the {kind} carries finalizers while the operator runs"

    stoppable_operator.stop()
    for kind, read in reads.items():
        name = "m1" if kind == "AIModel" else "f1"
        started = time.monotonic()
        crds.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
        wait_until(f"the {kind} gone without the operator", partial(gone, read), timeout=DELETE_DEADLINE_SECONDS)
        assert time.monotonic() - started < DELETE_DEADLINE_SECONDS
    # The children follow by garbage collection, operator or not.
    wait_until(
        "the Deployment of m1 garbage-collected",
        lambda: gone(lambda: crds.apps.read_namespaced_deployment("model-m1", namespace)),
        timeout=60,
    )
