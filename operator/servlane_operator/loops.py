"""The operator's periodic loops (periodic.py runs them without kopf timers) and whether this replica
may run a round at all (kopf peering)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial

from servlane_operator import periodic
from servlane_operator.context import OperatorContext
from servlane_operator.feature_passes import analyse_features
from servlane_operator.indexes import Indexes
from servlane_operator.model_passes import autoscale_models, resync_models
from servlane_operator.peering import leads

# One round of a loop over the objects kopf's indexes hold.
Round = Callable[[OperatorContext, Indexes], Awaitable[None]]


def start_loops(context: OperatorContext, indexes: Indexes) -> None:
    """Starts the periodic loops once, from the first object handler that runs: their tasks inherit its
    context, which kopf.event needs to post Events, and keep its indexes (live views, always current)."""
    if context.periodic:
        return
    settings = context.settings
    rounds: tuple[tuple[float, Round, str], ...] = (
        (settings.resync_seconds, resync_models, "resync"),
        (settings.autoscale_interval_seconds, autoscale_models, "autoscale"),
        (settings.analysis_interval_seconds, analyse_features, "canary analysis"),
    )
    for seconds, work, what in rounds:
        context.periodic.append(
            asyncio.create_task(
                periodic.every(seconds, partial(work, context, indexes), partial(may_act, context), what)
            )
        )


async def may_act(context: OperatorContext) -> bool:
    """Standalone: always. With peering: only the replica kopf lets work (see peering.py)."""
    peering = context.peering
    if peering is None:
        return False  # before kopf's startup: no round yet
    if peering.standalone:
        return True
    scopes: list[str | None] = [*context.settings.namespaces] or [None]  # None: cluster-wide
    for namespace in scopes:
        body = await context.kube.get_peering(peering.name, namespace)
        status = (body or {}).get("status") or {}
        peers = {key: value for key, value in status.items() if isinstance(value, dict)}
        if body is None or not leads(peers, peering.priority, datetime.now(UTC)):
            return False
    return True
