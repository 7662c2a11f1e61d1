"""A batch that cannot be validated fails alone: whatever goes wrong with one input file (an error the rules
did not foresee, a row the database refuses) fails that batch with a message, and the worker's next round
validates the next batch instead of stopping on the same one after every lease."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from servlane_core.protocol.limits import RequestLimits
from servlane_gateway.batch import rules
from servlane_gateway.batch.metrics import BatchMetrics
from servlane_gateway.batch.store import BatchStore
from servlane_gateway.batch.worker import BatchWorker
from servlane_gateway.state import GatewayState

CHAT = "/v1/chat/completions"


def validate_or_break(
    content: bytes, _endpoint: str, _callable: Any, _limits: RequestLimits | None = None
) -> rules.Validated:
    if b"boom" in content:
        raise ValueError("an input the rules did not foresee")
    return rules.Validated(requests=[rules.RequestLine(1, "a", {"model": "chat"})])


def test_a_batch_whose_validation_raises_fails_alone_and_the_next_one_is_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BatchStore(f"sqlite:///{tmp_path / 'batch.db'}")
    store.migrate()
    monkeypatch.setattr(rules, "validate", validate_or_break)  # as the worker calls it
    state = SimpleNamespace(table=object(), limits=RequestLimits())  # a table: validation may run
    runner = BatchWorker(store, cast(GatewayState, state), BatchMetrics(CollectorRegistry()), 1, 60, 1)
    try:
        ids = []
        for owner, content in (("team-a", b"boom"), ("team-b", b"{}")):
            file = store.add_file(owner, "batch", "in.jsonl", content, 1)
            ids.append(store.create_batch(owner, file["id"], CHAT, "24h", None, 1)["id"])
        assert asyncio.run(runner._validate_one())
        assert asyncio.run(runner._validate_one())
        broken, fine = store.get_batch("team-a", ids[0]), store.get_batch("team-b", ids[1])
        assert broken is not None
        assert fine is not None
        assert broken["status"] == rules.FAILED
        assert broken["errors"]["data"][0]["code"] == "invalid_file"
        assert "could not be validated (ValueError)" in broken["errors"]["data"][0]["message"]
        assert fine["status"] == rules.IN_PROGRESS
    finally:
        store.close()
