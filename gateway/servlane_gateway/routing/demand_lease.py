"""The demand signal of a model with no ready pod: a coordination.k8s.io/v1 Lease the operator watches.

While the gateway holds requests for an AIModel, it keeps the Lease `servlane-demand-<model>` in the
model's namespace fresh (spec.renewTime now, spec.holderIdentity this gateway pod), labelled
`servlane.dev/model=<model>` and `app.kubernetes.io/managed-by=servlane-gateway`; the operator scales a
model at zero back up when such a Lease is fresh. It exists while no pod does, unlike any pod metric.

The hold queue asks for a signal at once for the first held request and then at most every few seconds
(HoldLimits.demand_renew); here each ask becomes one write on a thread of its own, never on the event
loop, and asks for a model whose write is still under way are dropped (the next renewal comes anyway).
A Lease of that name that the gateway did not write (without its labels) is left alone: the gateway
only ever writes its own. Without Kubernetes (a routes file) the sink is a no-op or a callback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from servlane_core.routing.waking import DEMAND_MANAGED_BY, DEMAND_MODEL_LABEL, demand_lease_name

log = logging.getLogger(__name__)


class DemandSink(Protocol):
    def signal(self, namespace: str, model: str) -> None:
        """Requests are held for AIModel `namespace/model`: say so (without blocking the event loop)."""

    def close(self) -> None: ...


class NoDemand:
    """Nothing to tell (a routes file: whatever starts the runtimes does not scale them)."""

    def signal(self, namespace: str, model: str) -> None:
        return None

    def close(self) -> None:
        return None


class CallbackDemand:
    """Hands each signal to a callback on the event loop (tests, embedding programs)."""

    def __init__(self, callback: Callable[[str, str], None]) -> None:
        self.callback = callback

    def signal(self, namespace: str, model: str) -> None:
        self.callback(namespace, model)

    def close(self) -> None:
        return None


def holder_identity() -> str:
    """This gateway pod's name (the downward API's POD_NAME, else the host name, which a pod's is)."""
    return os.environ.get("POD_NAME", "").strip() or socket.gethostname()


def lease_body(namespace: str, model: str, holder: str, now: datetime) -> dict[str, Any]:
    """The demand Lease as written: created whole, or patched (only its spec and labels change)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # a MicroTime
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": demand_lease_name(model),
            "namespace": namespace,
            "labels": {DEMAND_MODEL_LABEL: model, DEMAND_MANAGED_BY[0]: DEMAND_MANAGED_BY[1]},
        },
        "spec": {"holderIdentity": holder, "renewTime": stamp},
    }


def is_ours(lease: dict[str, Any], model: str) -> bool:
    labels = (lease.get("metadata") or {}).get("labels") or {}
    return labels.get(DEMAND_MANAGED_BY[0]) == DEMAND_MANAGED_BY[1] and labels.get(DEMAND_MODEL_LABEL) == model


class KubeDemandLease:
    """Writes demand Leases with the Kubernetes client, on one thread of its own."""

    def __init__(self, api: Any = None, holder: str | None = None, clock: Callable[[], datetime] | None = None):
        self._api = api  # a CoordinationV1Api; made on first use (tests pass their own)
        self.holder = holder or holder_identity()
        self.clock = clock or (lambda: datetime.now(UTC))
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demand-lease")
        self._pending: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.writes = 0  # Leases created or renewed (the tests read it)

    def signal(self, namespace: str, model: str) -> None:
        key = (namespace, model)
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
        with contextlib.suppress(RuntimeError):  # shutting down
            self._writer.submit(self._write, namespace, model)

    def close(self) -> None:
        self._writer.shutdown(wait=False, cancel_futures=True)

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.CoordinationV1Api()
        return self._api

    def _write(self, namespace: str, model: str) -> None:
        try:
            if self._write_lease(namespace, model):
                self.writes += 1
        except Exception as exc:  # the next renewal tries again; the held requests wait on regardless
            log.warning("could not write the demand Lease of %s/%s: %s", namespace, model, _reason(exc))
        finally:
            with self._lock:
                self._pending.discard((namespace, model))

    def _write_lease(self, namespace: str, model: str) -> bool:
        """Creates or renews the Lease; False when one the gateway did not write holds its name."""
        from kubernetes.client.exceptions import ApiException

        api = self._client()
        name = demand_lease_name(model)
        body = lease_body(namespace, model, self.holder, self.clock())
        try:
            current = api.read_namespaced_lease(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                api.create_namespaced_lease(namespace, body)
                return True
            except ApiException as created:
                if created.status != 409:  # another gateway replica created it meanwhile: renew it below
                    raise
            current = api.read_namespaced_lease(name, namespace, _preload_content=False)
        if not is_ours(_json(current), model):
            log.error(
                "a Lease %s/%s exists that the gateway did not write (its labels are not the demand Lease's): "
                "left alone, so requests held for AIModel %s do not wake it",
                namespace, name, model,
            )  # fmt: skip
            return False
        api.patch_namespaced_lease(name, namespace, {"spec": body["spec"]})
        return True


def _json(response: Any) -> dict[str, Any]:
    data = response.data if hasattr(response, "data") else response
    parsed = json.loads(data) if isinstance(data, bytes | str) else data
    return parsed if isinstance(parsed, dict) else {}


def _reason(exc: Exception) -> str:
    """A short reason, never a response body (it could echo anything)."""
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status is not None else type(exc).__name__
