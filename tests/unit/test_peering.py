"""The periodic loops work in the replica kopf peering lets work, and in no other (peering.leads)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from servlane_operator.peering import leads

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def peer(priority: int, seen_ago: float = 1, lifetime: int = 60) -> dict[str, object]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat()}


def test_the_highest_live_priority_leads() -> None:
    peers = {"a": peer(500), "b": peer(100)}
    assert leads(peers, 500, NOW)
    assert not leads(peers, 100, NOW)


def test_a_tie_pauses_both_as_kopf_does() -> None:
    assert not leads({"a": peer(500), "b": peer(500)}, 500, NOW)


def test_dead_peers_do_not_count() -> None:
    peers = {"a": peer(900, seen_ago=61), "b": peer(100)}
    assert leads(peers, 100, NOW)
    assert not leads({"a": peer(900, seen_ago=59), "b": peer(100)}, 100, NOW)


def test_before_our_own_keepalive_we_do_not_lead() -> None:
    assert not leads({}, 100, NOW)
    assert not leads({"a": peer(50)}, 100, NOW)


def test_kopf_timestamps_parse() -> None:
    assert leads({"a": {"priority": 7, "lifetime": 60, "lastseen": "2025-12-31T23:59:30.5+00:00"}}, 7, NOW)
    assert leads({"a": {"priority": 7, "lifetime": 60, "lastseen": "2025-12-31T23:59:30Z"}}, 7, NOW)
