"""An in-memory API server behind the operator's real Kube client, for reconciler tests.

Only the HTTP call is replaced: GET, server-side apply (a merge that keeps the stored metadata's uid and
anything the apply does not send), DELETE with its uid precondition, and status patches, which it records.
"""

from __future__ import annotations

import itertools
from typing import Any

from kubernetes.client.exceptions import ApiException

from servlane_operator.kube import Kube


class FakeKube(Kube):
    def __init__(self) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.statuses: list[dict[str, Any]] = []
        self._uids = itertools.count(1)

    def put(self, path: str, obj: dict[str, Any]) -> None:
        """An object someone else created (or the operator, earlier), stored as is with a uid."""
        obj.setdefault("metadata", {}).setdefault("uid", f"uid-stored-{next(self._uids)}")
        self.objects[path] = obj

    def _call(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if path.endswith("/status"):
            self.statuses.append(body["status"])
            return {}
        stored = self.objects.get(path)
        if method == "GET":
            if stored is None:
                raise ApiException(status=404, reason="Not Found")
            return stored
        if method == "DELETE":
            if stored is None:
                raise ApiException(status=404, reason="Not Found")
            wanted = ((body or {}).get("preconditions") or {}).get("uid")
            if wanted is not None and wanted != stored["metadata"]["uid"]:
                raise ApiException(status=409, reason="Conflict")
            del self.objects[path]
            return {}
        assert method == "PATCH", method
        merged = {**(stored or {}), **body}
        merged["metadata"] = {**(stored or {}).get("metadata", {}), **body["metadata"]}
        merged["metadata"].setdefault("uid", f"uid-applied-{next(self._uids)}")
        merged["metadata"]["generation"] = int(merged["metadata"].get("generation", 0)) + 1
        self.objects[path] = merged
        return merged
