"""Which pod of a model version gets a request, once the version is chosen by weight.

The gateway knows each version's pods from the EndpointSlices of its Service. Only an endpoint that is
ready and not terminating takes new requests (a terminating pod finishes what it has: draining). An
ejected endpoint (servlane_core.routing.outliers) is skipped unless every eligible one is ejected: a
stale ejection must never leave a version without a pod to try.

Policies (AIFeature spec.routing):
- least-load: power of two choices: two random candidates, the one with fewer requests in flight (as
  counted by this gateway). Close to the least loaded pod without every gateway replica herding onto it.
- prefix-affinity: consistent hashing with bounded loads over a prompt prefix (bounded_hashing).
- round-robin: each candidate in turn, in address order.

Pure: the caller passes the loads, the ejected set and the random source.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

LEAST_LOAD = "least-load"
PREFIX_AFFINITY = "prefix-affinity"
ROUND_ROBIN = "round-robin"
POLICIES = (LEAST_LOAD, PREFIX_AFFINITY, ROUND_ROBIN)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class Endpoint:
    address: str  # "10.0.0.5:8000" ("[fd00::5]:8000"): one pod's port, the key of its load and ejection
    pod: str  # the pod's name (the slice's targetRef), else the address: the metrics' `pod` label
    ready: bool = True
    terminating: bool = False

    @property
    def eligible(self) -> bool:
        """May take a new request: ready, and not on its way out."""
        return self.ready and not self.terminating

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"


def service_of(base_url: str) -> tuple[str, str] | None:
    """(namespace, service) of a cluster-DNS base URL (`http://<service>.<namespace>.svc.<domain>:<port>`,
    what the operator writes into AIModel.status.endpoint), else None: such a backend (an endpoint
    override, a local server) is called at its URL, as there are no pods to pick from."""
    host = urlsplit(base_url).hostname or ""
    parts = host.split(".")
    if len(parts) < 3 or parts[2] != "svc" or not all(_DNS_LABEL.fullmatch(p) for p in parts[:2]):
        return None
    return parts[1], parts[0]


def candidates(
    endpoints: Sequence[Endpoint], ejected: Collection[str] = (), exclude: Collection[str] = ()
) -> list[Endpoint]:
    """The endpoints that may take this request: eligible, not excluded (already tried for it), and not
    ejected, unless all of those are ejected (then the ejected ones: better a suspect pod than none)."""
    eligible = [e for e in endpoints if e.eligible and e.address not in exclude]
    healthy = [e for e in eligible if e.address not in ejected]
    return healthy or eligible


def least_loaded(
    candidates: Sequence[Endpoint], load: Mapping[str, int], rng: random.Random | None = None
) -> Endpoint | None:
    """Power of two choices: the less loaded of two distinct random candidates (a tie: the first drawn)."""
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    first, second = (rng or random).sample(list(candidates), 2)
    return first if load.get(first.address, 0) <= load.get(second.address, 0) else second


class RoundRobin:
    """Each candidate in turn, per group (a version's Service), in address order, so the turn survives
    the list arriving in another order. Stateful, but decides nothing else."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def pick(self, group: str, candidates: Sequence[Endpoint]) -> Endpoint | None:
        if not candidates:
            return None
        ordered = sorted(candidates, key=lambda e: e.address)
        turn = self._next.get(group, 0)
        self._next[group] = (turn + 1) % (1 << 30)
        return ordered[turn % len(ordered)]
