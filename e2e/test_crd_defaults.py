"""The partial manifests of tests/support/defaulting_cases.py against a real API server: each is accepted, and the
spec it stores (its defaults applied) is the spec pydantic makes of the same manifest.

tests/unit/test_crd_defaults.py checks the same table against a model of Kubernetes' defaulting.
"""

from __future__ import annotations

import pytest

from servlane_api.aifeature import AIFeature
from servlane_api.aimodel import AIModel
from servlane_api.cel import CelValidated
from tests.support.cluster_harness import GROUP, PLURALS, VERSION, Kube, json_object
from tests.support.defaulting_cases import PARTIAL_MANIFESTS, Partial

pytestmark = pytest.mark.e2e

RESOURCES: dict[str, type[CelValidated]] = {"AIModel": AIModel, "AIFeature": AIFeature}


@pytest.mark.parametrize("case", PARTIAL_MANIFESTS, ids=lambda case: case.id)
def test_the_api_server_defaults_a_partial_spec_like_pydantic(crds: Kube, namespace: str, case: Partial) -> None:
    kind = case.manifest["kind"]
    plural = PLURALS[kind]
    crds.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, case.manifest)
    stored = json_object(
        crds.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, case.manifest["metadata"]["name"]),
        case.id,
    )
    expected = RESOURCES[kind].model_validate(case.manifest).to_api()["spec"]
    assert stored["spec"] == expected
