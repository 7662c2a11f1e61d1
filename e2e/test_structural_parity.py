"""The structural cases of tests/support/structural_cases.py against a real API server (server-side dry run with
kubectl's default strict field validation): it refuses each bad case naming the same field as standalone mode's
check (tests/unit/test_structural.py), and accepts each good one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.cluster_harness import GROUP, PLURALS, VERSION, Kube
from tests.support.structural_cases import STRUCTURAL_CASES, StructuralCase

pytestmark = pytest.mark.e2e


def dry_run_create(kube: Kube, namespace: str, manifest: dict[str, Any]) -> None:
    plural = PLURALS[manifest["kind"]]
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, manifest, dry_run="All", field_validation="Strict"
    )


@pytest.mark.parametrize("case", STRUCTURAL_CASES, ids=lambda case: case.id)
def test_the_api_server_refuses_what_standalone_mode_refuses(crds: Kube, namespace: str, case: StructuralCase) -> None:
    if case.refused_at is None:
        dry_run_create(crds, namespace, case.manifest)
        return
    with pytest.raises(ApiException) as info:
        dry_run_create(crds, namespace, case.manifest)
    assert info.value.status in (400, 422), info.value.body
    message = json.loads(str(info.value.body))["message"]
    assert (case.api_server_says or case.refused_at) in message, message
