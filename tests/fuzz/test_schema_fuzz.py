"""Bad input is a 4xx, always: a property-based fuzz of the runtime's and the gateway's OpenAPI schemas
(schemathesis), valid and invalid cases, against real processes with a real engine. No case may get a 5xx,
and /health answers quickly throughout. The larger run behind the figures in docs/concepts.md is bench/fuzz_servers.py.

Part of the default suite, bounded: a fixed number of cases per operation, a fixed seed, each case's
generation capped and timed out (tests/support/schema_fuzz.py says how). Skips when schemathesis, hypothesis
or the transformers engine is not installed, except in CI (CI=true), where that is a failure. The same fuzz runs
against the vLLM engine at its defaults, where vLLM is installed (CI installs it: a missing vLLM fails there).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

NEEDED = ("schemathesis", "hypothesis", "torch", "transformers")
_missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the fuzz needs {', '.join(_missing)}, not installed, but CI=true", pytrace=False)
    pytest.skip(f"the fuzz needs {', '.join(_missing)} (not installed)", allow_module_level=True)

import schemathesis  # noqa: E402

from servlane_runtime.app import create_app  # noqa: E402
from tests.support.schema_fuzz import (  # noqa: E402
    ENGINES,
    HEALTH_BOUND_SECONDS,
    MAX_TOKENS_CAP,
    N_CAP,
    Engine,
    HealthWatch,
    Server,
    bound_work,
    draw_cases,
    fuzz,
    runtime_config,
    servers,
)
from tests.support.vllm import require_vllm  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    # The backstop, per test (the first of an engine includes its start): the transformers half takes about
    # a minute on 2 cores, the vLLM half its start and about as long again; several times that is a regression
    # to look at, not a wait.
    pytest.mark.timeout(900),
]

# Per operation and generation mode: about 130 cases on the runtime (3 POST operations, valid and invalid, and
# the 4 GETs without parameters, which have one or two distinct cases and no invalid one), about 400 on the
# gateway (its Batch API's operations too).
CASES_PER_OPERATION_AND_MODE = 20


@pytest.fixture(scope="module", params=ENGINES)
def both(request: pytest.FixtureRequest) -> Iterator[tuple[Server, Server]]:
    engine: Engine = request.param
    if engine == "vllm":
        require_vllm()
    with servers(engine) as pair:
        yield pair


@pytest.mark.parametrize("which", [0, 1], ids=["runtime", "gateway"])
def test_no_case_from_the_schema_is_a_5xx(both: tuple[Server, Server], which: int) -> None:
    server = both[which]
    with HealthWatch(both) as watch:
        result = fuzz(server, CASES_PER_OPERATION_AND_MODE, seed=which)
    report = json.dumps(result.as_json() | {"health": watch.as_json()}, indent=1)
    print(report)  # the status counts and the slowest cases, for `pytest -s`
    # Every POST operation, valid and invalid (the GETs without parameters have one or two distinct cases).
    assert result.cases >= 3 * 2 * CASES_PER_OPERATION_AND_MODE, report
    assert not result.server_errors, "\n".join(result.server_errors)
    assert sum(n for status, n in result.statuses.items() if 400 <= status < 500) > result.cases // 3, report
    assert result.generated > 0, report  # some cases reached the engine and were served
    assert watch.polls > 0, report
    assert not watch.failures, report
    assert watch.slowest < HEALTH_BOUND_SECONDS, report


def _drawn(seed: int) -> list[str]:
    """The cases one seed draws from the runtime's schema, as text (no server: the app's own OpenAPI)."""
    app = create_app(runtime_config(Path("/unused")))
    schema = schemathesis.openapi.from_dict(app.openapi())
    seen: list[str] = []

    def visit(case: Any) -> None:
        seen.append(json.dumps([case.method, case.path, case.query, case.body], default=repr, sort_keys=True))

    draw_cases(schema, 3, seed, "tiny-llama", visit)
    return seen


def test_the_seed_alone_decides_the_cases() -> None:
    first = _drawn(seed=5)
    assert len(first) >= 7 * 3
    assert _drawn(seed=5) == first
    assert _drawn(seed=6) != first


def test_bound_work_lowers_only_valid_costly_values() -> None:
    body: dict[str, Any] = {"n": 16, "max_tokens": 4000, "max_completion_tokens": 2}
    bound_work(body)
    assert body == {"n": N_CAP, "max_tokens": MAX_TOKENS_CAP, "max_completion_tokens": 2}
    invalid: dict[str, Any] = {"n": "16", "max_tokens": True, "max_completion_tokens": -5}
    bound_work(invalid)
    assert invalid == {"n": "16", "max_tokens": True, "max_completion_tokens": -5}  # still 400s
    absent: dict[str, Any] = {"prompt": "x"}
    bound_work(absent)
    assert absent == {"prompt": "x", "max_tokens": MAX_TOKENS_CAP}
    null: dict[str, Any] = {"max_tokens": None, "max_completion_tokens": None}  # null is absent
    bound_work(null)
    assert null == {"max_tokens": MAX_TOKENS_CAP, "max_completion_tokens": None}
