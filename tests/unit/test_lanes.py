"""The operator's reconcile lanes: a bounded number at once, the waiting ones by priority, none lost."""

from __future__ import annotations

import asyncio

import pytest

from servlane_operator.lanes import Lanes, Priority


async def _hold(lanes: Lanes, priority: Priority, order: list[str], name: str, release: asyncio.Event) -> None:
    async with lanes.slot(priority):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    """Lets every ready task run until it blocks (several loop turns, no wall-clock wait)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_at_most_slots_run_and_waiters_go_by_priority_then_arrival() -> None:
    async def scenario() -> list[str]:
        lanes, release = Lanes(2), asyncio.Event()
        order: list[str] = []
        tasks = [asyncio.create_task(_hold(lanes, Priority.CREATE, order, f"burst-{i}", release)) for i in range(2)]
        await _settle()
        assert lanes.busy == 2
        # Arrive while both slots are taken: a resync, more of the burst, then a team's edit.
        for name, priority in [
            ("resync", Priority.RESYNC),
            ("burst-2", Priority.CREATE),
            ("burst-3", Priority.CREATE),
            ("edit", Priority.CHANGE),
        ]:
            tasks.append(asyncio.create_task(_hold(lanes, priority, order, name, release)))
            await _settle()
        assert lanes.waiting == 4
        assert order == ["burst-0", "burst-1"]
        release.set()
        await asyncio.gather(*tasks)
        assert lanes.busy == 0
        assert lanes.waiting == 0
        return order

    assert asyncio.run(scenario()) == ["burst-0", "burst-1", "edit", "burst-2", "burst-3", "resync"]


def test_a_cancelled_waiter_gives_up_its_place_and_the_slot_still_passes_on() -> None:
    async def scenario() -> list[str]:
        lanes, release = Lanes(1), asyncio.Event()
        order: list[str] = []
        holder = asyncio.create_task(_hold(lanes, Priority.CREATE, order, "holder", release))
        await _settle()
        quitter = asyncio.create_task(_hold(lanes, Priority.CHANGE, order, "quitter", release))
        later = asyncio.create_task(_hold(lanes, Priority.RESYNC, order, "later", release))
        await _settle()
        quitter.cancel()
        await _settle()
        release.set()
        await asyncio.gather(holder, later)
        with pytest.raises(asyncio.CancelledError):
            await quitter
        assert lanes.busy == 0
        return order

    assert asyncio.run(scenario()) == ["holder", "later"]


def test_a_failing_reconcile_frees_its_slot() -> None:
    async def scenario() -> int:
        lanes = Lanes(1)
        with pytest.raises(RuntimeError):
            async with lanes.slot(Priority.CHANGE):
                raise RuntimeError("the API server said no")
        async with lanes.slot(Priority.CHANGE):
            return lanes.busy

    assert asyncio.run(scenario()) == 1


def test_lanes_need_a_slot() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Lanes(0)
