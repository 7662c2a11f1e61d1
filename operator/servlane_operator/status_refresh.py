"""AIModel status refreshes from child events, coalesced per model and run in the lanes' STATUS slots."""

from __future__ import annotations

import asyncio
import logging

from servlane_operator import aimodel_reconciler
from servlane_operator.context import OperatorContext
from servlane_operator.indexes import Indexes, ModelKey
from servlane_operator.lanes import Priority

log = logging.getLogger(__name__)


def request_refresh(
    context: OperatorContext, indexes: Indexes, key: ModelKey, *, only_once_applied: bool = False
) -> None:
    """Queues one status refresh of the model, unless one is already waiting, and returns at once.

    Returning at once matters: kopf handles one event per object at a time, so a handler that waited here
    for a slot (behind a burst of other models) would hold back that object's next event, a spec edit
    included. Waiting refreshes coalesce: the one that runs reads the indexes when its slot comes, so it
    writes the latest view of every event that arrived before, once."""
    pending = context.refreshing
    if key in pending:  # one is waiting already: it will read what this event brought
        pending[key] = pending[key] and only_once_applied
        return
    pending[key] = only_once_applied
    task = asyncio.create_task(_refresh(context, indexes, key))
    context.refresh_tasks.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(context.refresh_tasks.discard)


async def _refresh(context: OperatorContext, indexes: Indexes, key: ModelKey) -> None:
    try:
        await context.lanes.acquire(Priority.STATUS)
    except asyncio.CancelledError:
        context.refreshing.pop(key, None)
        raise
    try:
        # From here on, a new event queues another refresh: this one may already have read the indexes.
        only_once_applied = context.refreshing.pop(key, False)
        owner = indexes.model(key)
        if owner is None:
            return  # the AIModel is gone; garbage collection removes the child
        deployment = indexes.deployment(key)
        if deployment is None and only_once_applied:
            return  # not applied yet: the change handler writes the first status
        pods = indexes.pods(key)
        await aimodel_reconciler.refresh_status(owner, context.kube, context.settings, deployment, pods)
    except Exception:  # the next event or resync writes it; kopf would only have logged it too
        log.exception("status refresh of %s/%s failed", *key)
    finally:
        context.lanes.release()
