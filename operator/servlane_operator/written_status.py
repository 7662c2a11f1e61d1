"""The AIFeature status this process wrote last, for a pass that starts before the watch has brought it.

A rollout pass plans from the feature's status. The index's copy lags the status patch by the watch's
delay, which on a loaded API server can exceed the analysis interval: a pass started from the copy
before the write would plan again from the step before (re-emit its events, re-apply its old pins).

Each write is kept with the status it was planned from. A copy whose status is still that base has not
caught up: the write is what holds. Any other copy is newer than the write (it arrived, or someone else
wrote after it, e.g. another operator replica that led meanwhile) and wins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _plain(value: Any) -> Any:
    """A JSON copy: kopf's body views and plain dicts compare alike, and later edits do not leak in."""
    return json.loads(json.dumps(value, default=dict))


class WrittenStatuses:
    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[Any, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def latest(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`body`, or `body` with the status written from it when the copy predates that write."""
        entry = self._by_uid.get(_uid(body))
        if entry is None:
            return body
        base, written = entry
        if _plain(body.get("status") or {}) != base:
            return body
        return {**body, "status": written}

    def wrote(self, planned_from: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """`status` was written (or found equal) by a pass that planned from `planned_from`."""
        self._by_uid[_uid(planned_from)] = (_plain(planned_from.get("status") or {}), _plain(status))

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))
