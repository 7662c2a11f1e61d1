"""Bad input is a 4xx, always: a property-based fuzz of the runtime's and the gateway's OpenAPI schemas
(schemathesis), valid and invalid cases, against real processes with a real engine. No case may get a 5xx,
and /health answers quickly throughout. The larger run behind the README's figures is bench/fuzz_servers.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fuzz.schema_fuzz import HEALTH_BOUND_SECONDS, HealthWatch, Server, fuzz, servers

pytestmark = [
    pytest.mark.slow,
    # Opt-in for now: one run here took over 5 minutes for ~180 runtime cases (the helper's run: ~37 s for
    # both servers); until its time is bounded in CI it must not hold the suite. The figures come from
    # bench/fuzz_servers.py.
    pytest.mark.skipif(os.environ.get("SERVLANE_FUZZ") != "1", reason="opt-in: set SERVLANE_FUZZ=1"),
]

CASES_PER_OPERATION_AND_MODE = 40  # about 270 cases per server: under a minute each on 2 cores


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[Server, Server]]:
    with servers() as pair:
        yield pair


@pytest.mark.parametrize("which", [0, 1], ids=["runtime", "gateway"])
def test_no_case_from_the_schema_is_a_5xx(both: tuple[Server, Server], which: int) -> None:
    server = both[which]
    with HealthWatch(both) as watch:
        result = fuzz(server, CASES_PER_OPERATION_AND_MODE, seed=which)
    assert result.cases >= 200, result.as_json()
    assert not result.server_errors, "\n".join(result.server_errors)
    assert sum(n for status, n in result.statuses.items() if 400 <= status < 500) > result.cases // 3
    assert result.generated > 0, result.as_json()  # some cases reached the engine and were served
    assert watch.polls > 0, watch.as_json()
    assert not watch.failures, watch.as_json()
    assert watch.slowest < HEALTH_BOUND_SECONDS, watch.as_json()
