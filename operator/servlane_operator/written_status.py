"""The AIFeature status this process wrote last, for a pass that starts before the watch has brought it.

A rollout pass plans from the feature's status, and the Deployments' pins are read from every feature's
status. The index's copy of a feature lags its status patches: kopf updates it when it processes the
object's next event, which a busy worker can delay past several analysis intervals. Seen in CI: a
resync read "no pin" from a copy that predated the canary's first pin, and took the canary from 1
replica back to 2 for one pass.

Per feature (by uid) this keeps the chain of statuses this process wrote, each pass's starting point
included. A copy whose status is in that chain but not its end is behind: the last write is what holds.
Any other copy is not ours (another operator replica led meanwhile, someone edited the status) and wins.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

# Writes remembered per feature: a copy further behind than this counts as someone else's.
CHAIN_LENGTH = 16


def _plain(value: Any) -> Any:
    """A JSON copy: kopf's body views and plain dicts compare alike, and later edits do not leak in."""
    return json.loads(json.dumps(value, default=dict))


class WrittenStatuses:
    def __init__(self) -> None:
        self._chains: dict[str, deque[Any]] = {}

    def __len__(self) -> int:
        return len(self._chains)

    def latest(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`body`, or `body` with the status this process wrote last when the copy is behind it."""
        chain = self._chains.get(_uid(body))
        if chain is None:
            return body
        status = _plain(body.get("status") or {})
        if status == chain[-1] or status not in chain:
            return body
        return {**body, "status": chain[-1]}

    def wrote(self, planned_from: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """`status` was written (or found equal) by a pass that planned from `planned_from`."""
        uid = _uid(planned_from)
        base = _plain(planned_from.get("status") or {})
        chain = self._chains.get(uid)
        if chain is None or chain[-1] != base:
            chain = self._chains[uid] = deque([base], maxlen=CHAIN_LENGTH)  # not from our last write: anew
        written = _plain(status)
        if written != chain[-1]:
            chain.append(written)

    def forget(self, uid: str) -> None:
        self._chains.pop(uid, None)


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))
