"""The gateway's demand Lease against a real API server: created with the labels the operator watches for,
renewed, and a Lease of that name the gateway did not write left alone."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from servlane_gateway.routing.demand_lease import KubeDemandLease
from tests.support.cluster_harness import Kube
from tests.support.polling import wait_until


def _not_found(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def test_the_demand_lease_is_written_renewed_and_never_written_over_someone_elses(kube: Kube, namespace: str) -> None:
    leases = client.CoordinationV1Api(kube.api)
    writer = KubeDemandLease(leases, holder="gateway-0")
    try:
        writer.signal(namespace, "chat")
        lease: Any = wait_until(
            "the demand Lease", lambda: leases.read_namespaced_lease("servlane-demand-chat", namespace), 30,
            tolerate=_not_found,
        )  # fmt: skip
        assert lease.metadata.labels == {
            "servlane.dev/model": "chat",
            "app.kubernetes.io/managed-by": "servlane-gateway",
        }
        assert lease.spec.holder_identity == "gateway-0"
        first = lease.spec.renew_time
        assert first is not None

        def renewed() -> Any:
            writer.signal(namespace, "chat")
            again = leases.read_namespaced_lease("servlane-demand-chat", namespace)
            assert again.spec is not None
            return again if again.spec.renew_time > first else None

        wait_until("the Lease renewed", renewed, 30, interval=0.2)
        selected = leases.list_namespaced_lease(namespace, label_selector="servlane.dev/model=chat").items
        # What the operator watches.
        assert [item.metadata.name for item in selected if item.metadata] == ["servlane-demand-chat"]

        foreign = client.V1Lease(
            metadata=client.V1ObjectMeta(name="servlane-demand-other"),
            spec=client.V1LeaseSpec(holder_identity="someone-else"),
        )
        leases.create_namespaced_lease(namespace, foreign)
        wait_until("the renewals done", lambda: not writer._pending, 30)
        writes = writer.writes
        writer.signal(namespace, "other")
        wait_until("the writer done with it", lambda: not writer._pending, 30)
        assert writer.writes == writes  # read, and left alone
        kept = leases.read_namespaced_lease("servlane-demand-other", namespace)
        assert kept.spec is not None
        assert kept.metadata is not None
        assert kept.spec.holder_identity == "someone-else"
        assert kept.spec.renew_time is None
        assert not kept.metadata.labels
    finally:
        writer.close()
