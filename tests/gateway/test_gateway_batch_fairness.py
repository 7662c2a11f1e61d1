"""The batch worker's claims are fair across owners: the free places of a round go first to the owners with
the fewest requests in flight, so one key's small batch does not wait behind another key's huge one, and
what an owner cannot use goes to the others (no place is left idle while there is work).

The worker runs one round (`step`) against a store stand-in that records what was claimed; the requests it
starts never finish, so nothing frees a place behind the test's back."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import CollectorRegistry

from servlane_gateway.batch import rules
from servlane_gateway.batch.metrics import BatchMetrics
from servlane_gateway.batch.store import Active, BatchStore, Claimed
from servlane_gateway.batch.worker import BatchWorker
from servlane_gateway.state import GatewayState

CHAT = "/v1/chat/completions"
FAR = 10**12  # no batch expires during the test


class Store:
    """Batches (oldest first) with `pending` requests each; claims hand out the lowest lines first."""

    def __init__(self, pending: dict[Active, int]) -> None:
        self.pending = dict(pending)
        self.claims: list[tuple[str, int]] = []  # (batch, how many it got), in the order asked

    def active_batches(self) -> list[Active]:
        return list(self.pending)

    def claim_requests(self, batch_id: str, _me: str, _now: float, _lease: float, limit: int) -> list[Claimed]:
        batch = next(b for b in self.pending if b.id == batch_id)
        got = min(limit, self.pending[batch])
        first = sum(n for b, n in self.claims if b == batch_id) + 1
        self.pending[batch] -= got
        self.claims.append((batch_id, got))
        lines = range(first, first + got)
        return [Claimed(batch_id, line, f"{batch_id}-{line}", {"model": "chat"}, 1) for line in lines]

    def try_finalize(self, _batch_id: str, _now: float) -> str | None:
        return None


def batch(batch_id: str, owner: str) -> Active:
    return Active(batch_id, owner, CHAT, rules.IN_PROGRESS, FAR)


async def one_round(store: Store, concurrency: int, in_flight: dict[str, int]) -> dict[str, int]:
    """What each batch holds after one round, when `in_flight` requests of each batch were already held."""
    worker = BatchWorker(
        cast(BatchStore, store),
        # No route table: nothing to validate this round; a keys file that parses (else every line waits).
        cast(GatewayState, SimpleNamespace(table=None, keys=SimpleNamespace(broken=False))),
        BatchMetrics(CollectorRegistry()),
        concurrency=concurrency,
        lease=60,
        poll=1,
    )
    never = asyncio.Event()

    async def sending_forever(_batch: Active, _request: Claimed) -> None:
        await never.wait()

    async def held_forever() -> None:
        await never.wait()

    worker._send = sending_forever  # type: ignore[method-assign,assignment]
    for batch_id, count in in_flight.items():
        for line in range(count):
            worker.held[(batch_id, 10_000 + line)] = asyncio.create_task(held_forever())
    await worker.step()
    held: dict[str, int] = {}
    for batch_id, _line in worker.held:
        held[batch_id] = held.get(batch_id, 0) + 1
    for task in worker.held.values():
        task.cancel()
    return held


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_small_batch_of_another_owner_gets_the_next_free_place_not_the_huge_batch_before_it() -> None:
    store = Store({batch("huge", "team-a"): 1000, batch("small", "team-b"): 2})
    # 2 per feature in flight, twice that held: 4 places, 3 held by the huge batch, so one is free.
    held = run(one_round(store, concurrency=2, in_flight={"huge": 3}))
    assert held == {"huge": 3, "small": 1}
    assert store.pending[batch("huge", "team-a")] == 1000  # first come is not first served


def test_free_places_are_shared_between_owners_and_what_one_cannot_use_goes_to_the_other() -> None:
    store = Store({batch("huge", "team-a"): 1000, batch("small", "team-b"): 1})
    held = run(one_round(store, concurrency=4, in_flight={}))  # 8 free places
    assert held == {"huge": 7, "small": 1}  # team-b could use only one: none is left idle
    even = Store({batch("a1", "team-a"): 1000, batch("a2", "team-a"): 1000, batch("b", "team-b"): 1000})
    held = run(one_round(even, concurrency=4, in_flight={}))
    assert held["b"] == 4  # an owner's share, however many batches the other owner has
    assert held["a1"] + held.get("a2", 0) == 4
