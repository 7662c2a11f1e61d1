"""Whether this replica is the one kopf peering lets work: the same rule kopf applies to its handlers.

The periodic loops (periodic.py) are not kopf handlers, so kopf cannot pause them in a standby replica;
they ask this before each round. kopf keeps every replica's keep-alive in the peering object's status
(`{identity: {priority, lifetime, lastseen}}`) and pauses a replica while any live peer has a higher
priority, or the same one (a tie pauses both). Our own identity is kopf's secret, but our priority is
ours (handlers.startup draws it), so: we lead when exactly one live peer has a priority of ours or more,
and it has ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any


def _alive(peer: Mapping[str, Any], now: datetime) -> bool:
    lastseen = peer.get("lastseen")
    if not isinstance(lastseen, str):
        return False
    seen = datetime.fromisoformat(lastseen.replace("Z", "+00:00"))
    return seen + timedelta(seconds=int(peer.get("lifetime", 60))) > now


def leads(peers: Mapping[str, Mapping[str, Any]], priority: int, now: datetime) -> bool:
    """True when kopf would let the replica with `priority` work, given one peering object's status.
    No keep-alive of ours yet (just started) counts as not leading: a round is skipped, none is doubled."""
    contenders = [int(p.get("priority", 0)) for p in peers.values() if _alive(p, now)]
    contenders = [p for p in contenders if p >= priority]
    return contenders == [priority]
