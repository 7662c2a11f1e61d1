"""When a demand Lease wakes a model at zero (the Lease's name and labels: servlane_core.routing.waking).

The gateway renews the Lease at most every few seconds while it holds requests for the model; the operator
wakes the AIModel named by it, in its own namespace only, while it is fresh (renewed within
DEMAND_FRESH_SECONDS). A Lease only ever wakes the model it is named after, so a team can wake only its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from servlane_core.routing.waking import DEMAND_MANAGED_BY, DEMAND_MODEL_LABEL, demand_lease_name

DEMAND_FRESH_SECONDS = 60.0
# The label selector of demand Leases (what the operator lists and watches).
DEMAND_LABELS = {DEMAND_MANAGED_BY[0]: DEMAND_MANAGED_BY[1]}


def demanded_model(name: str, labels: Mapping[str, str]) -> str | None:
    """The AIModel a Lease asks for: the one its model label names, if the Lease is named after it."""
    model = labels.get(DEMAND_MODEL_LABEL)
    if model is None or labels.get(DEMAND_MANAGED_BY[0]) != DEMAND_MANAGED_BY[1] or name != demand_lease_name(model):
        return None
    return model


def renewed_at(lease: Mapping[str, Any]) -> float | None:
    """A Lease's spec.renewTime (a MicroTime, RFC 3339 with microseconds) in seconds since the epoch."""
    text = (lease.get("spec") or {}).get("renewTime")
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def is_fresh(renewed: float | None, now: float) -> bool:
    """Renewed within DEMAND_FRESH_SECONDS (a renewTime ahead of this clock, a skew, counts as now)."""
    return renewed is not None and now - renewed <= DEMAND_FRESH_SECONDS
