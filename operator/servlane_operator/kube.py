"""Kubernetes I/O at the edge: server-side apply, delete and status patches via the official client.

The client is synchronous, so every call runs in a worker thread and the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from servlane_operator.labels import FIELD_MANAGER

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "NetworkPolicy": "networkpolicies",
    "ConfigMap": "configmaps",
    "AIModel": "aimodels",
    "AIFeature": "aifeatures",
}


def load_client(pool_size: int = 32) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG).
    One pooled connection per worker thread (see main.py), so bursts do not churn connections."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


# Children this process saw absent (deleted, or a 404): bounded so that model churn cannot grow it forever.
_MAX_KNOWN_ABSENT = 100_000


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # (kind, namespace, name) of children known not to exist since our last delete, so a reconcile of
        # a model without autoscaling does not send a DELETE for its HPA (a 404) every time.
        self._known_absent: set[tuple[str, str, str]] = set()

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        query: list[Any] | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, header_params=headers, body=body)
        response.read()
        if response.status >= 400:
            raise ApiException(http_resp=response)
        return dict(json.loads(response.data)) if response.data else {}

    async def apply(
        self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """Server-side apply, by default with the operator's one field manager, taking over conflicting
        fields (so a hand edit of an owned field is put back)."""
        meta = obj["metadata"]
        self._known_absent.discard((obj["kind"], meta["namespace"], meta["name"]))
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", field_manager), ("force", "true" if force else "false")]
        return await asyncio.to_thread(
            self._call, "PATCH", path, body=obj, content_type="application/apply-patch+yaml", query=query
        )

    def known_absent(self, kind: str, namespace: str, name: str) -> bool:
        """This process deleted (or found absent) the object and has not applied it since."""
        return (kind, namespace, name) in self._known_absent

    def remember_absent(self, kind: str, namespace: str, name: str) -> None:
        key = (kind, namespace, name)
        if len(self._known_absent) >= _MAX_KNOWN_ABSENT:
            self._known_absent.clear()
        self._known_absent.add(key)

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, recheck: bool = True, uid: str | None = None
    ) -> bool:
        """Deletes if present; True when something was deleted. recheck=False trusts that a child this
        process deleted (or found absent) before, and has not applied since, is still absent. With `uid`,
        only that very object is deleted (a precondition): one recreated meanwhile under the name fails (409)."""
        key = (kind, namespace, name)
        if not recheck and key in self._known_absent:
            return False
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await asyncio.to_thread(self._call, "DELETE", resource_path(api_version, kind, namespace, name), body=body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            deleted = False
        else:
            deleted = True
        self.remember_absent(*key)
        return deleted

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge-patches the status subresource (explicit nulls clear fields the status no longer has)."""
        path = resource_path(api_version, kind, namespace, name) + "/status"
        await asyncio.to_thread(
            self._call, "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
        )

    async def patch_metadata(
        self, api_version: str, kind: str, namespace: str, name: str, metadata: dict[str, Any]
    ) -> None:
        path = resource_path(api_version, kind, namespace, name)
        await asyncio.to_thread(
            self._call, "PATCH", path, body={"metadata": metadata}, content_type="application/merge-patch+json"
        )

    async def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Pods matching the selector, in one namespace or (None) all of them."""
        query = [("labelSelector", label_selector)]
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        result = await asyncio.to_thread(self._call, "GET", path, query=query)
        return list(result.get("items", []))

    async def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        """core/v1 Events of one namespace matching the field selector (e.g. one pod's)."""
        query = [("fieldSelector", field_selector)]
        result = await asyncio.to_thread(self._call, "GET", f"/api/v1/namespaces/{namespace}/events", query=query)
        return list(result.get("items", []))

    async def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """kopf's peering object: the ClusterKopfPeering `name`, or (namespaced) the KopfPeering in `namespace`."""
        path = (
            f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}"
            if namespace is None
            else f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}"
        )
        try:
            return await asyncio.to_thread(self._call, "GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await asyncio.to_thread(self._call, "GET", resource_path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
