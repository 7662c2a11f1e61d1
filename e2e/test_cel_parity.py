"""The CEL cases of tests/support/cel_cases.py against a real API server, created with a server-side dry run.

tests/unit/test_cel_parity.py runs the same table through the pydantic twins; together they show that
the API server and typed code (operator, standalone mode) accept and reject the same manifests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from servlane_api.aifeature import AIFeature
from servlane_api.aimodel import AIModel
from servlane_api.cel import CelValidated
from tests.support.cel_cases import CEL_CASES, Case, flat_cases
from tests.support.cluster_harness import GROUP, PLURALS, VERSION, Kube

pytestmark = pytest.mark.e2e

RESOURCES: dict[str, type[CelValidated]] = {"AIModel": AIModel, "AIFeature": AIFeature}
ALL_MESSAGES = [rules.message for rules in CEL_CASES]


def dry_run_create(kube: Kube, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    plural = PLURALS[manifest["kind"]]
    created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, manifest, dry_run="All")
    assert isinstance(created, dict)
    return dict(created)


@pytest.mark.parametrize("case", flat_cases(), ids=lambda case: case.id)
def test_the_api_server_agrees_with_the_table(crds: Kube, namespace: str, case: Case) -> None:
    if case.rejected_with is None:
        created = dry_run_create(crds, namespace, case.manifest)
        # What the API server stores (defaults applied) is what the operator reads: it must parse too.
        RESOURCES[case.manifest["kind"]].model_validate(created)
        return
    with pytest.raises(ApiException) as info:
        dry_run_create(crds, namespace, case.manifest)
    assert info.value.status == 422, info.value.body
    reported = json.loads(str(info.value.body))["message"]
    assert case.rejected_with in reported
    # The case breaks this rule alone, as the pydantic twin (which stops at the first failure) assumes.
    others = [message for message in ALL_MESSAGES if message != case.rejected_with and message in reported]
    assert others == [], reported


def test_a_dry_run_leaves_nothing_behind(crds: Kube, namespace: str) -> None:
    """The cases above create nothing: a dry run is admitted and validated, not stored."""
    (case, *_) = (case for case in flat_cases() if case.rejected_with is None)
    dry_run_create(crds, namespace, case.manifest)
    plural = PLURALS[case.manifest["kind"]]
    stored = crds.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    assert isinstance(stored, dict)
    assert stored["items"] == []
