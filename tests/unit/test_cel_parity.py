"""Every CEL rule of the CRDs has a pydantic twin, and the twin agrees with the table in tests/support/cel_cases.py.

e2e/test_cel_parity.py runs the same table against a real API server.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from servlane_api.aifeature import AIFeature, Rollout
from servlane_api.aimodel import AIModel, ModelSource
from servlane_api.cel import CEL_KEY, CelRule, CelValidated, declared_rules
from servlane_api.crdgen import all_crds
from tests.support.cel_cases import CEL_CASES, Case, flat_cases

RESOURCES: dict[str, type[CelValidated]] = {"AIModel": AIModel, "AIFeature": AIFeature}


def all_declared() -> list[tuple[type[CelValidated], CelRule[Any]]]:
    return [found for resource in RESOURCES.values() for found in declared_rules(resource)]


def crd_rules(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (rule, message) in a CRD schema, at any depth."""
    found = [(v["rule"], v["message"]) for v in schema.get(CEL_KEY, [])]
    for sub in schema.get("properties", {}).values():
        found += crd_rules(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += crd_rules(schema[key])
    return found


def test_the_models_reach_every_rule_with_a_twin() -> None:
    declared = all_declared()
    owners = {cls.__name__ for cls, _ in declared}
    assert {"AIModel", "ModelSource", "Autoscaling", "CacheVolume", "AIModelSpec"} <= owners
    assert {"AIFeature", "AIFeatureSpec", "Rollout"} <= owners


def test_the_crds_hold_exactly_the_declared_rules() -> None:
    """No CEL rule reaches a CRD except through a CelRule, so none lacks a Python twin. A type used at several
    places (a LabelSelector) carries its rules at each."""
    in_crds = {
        found
        for crd in all_crds().values()
        for found in crd_rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    }
    declared = Counter((rule.rule, rule.message) for _, rule in all_declared())
    assert max(declared.values()) == 1, "one CelRule per rule"
    assert in_crds == set(declared)


def test_every_declared_rule_has_good_and_bad_cases() -> None:
    messages = [rule.message for _, rule in all_declared()]
    assert len(messages) == len(set(messages)), "rule messages must tell the rules apart"
    # The API server's refusal is searched for each message: one inside another would be found twice.
    inside = [(a, b) for a in messages for b in messages if a != b and a in b]
    assert not inside, f"a rule's message is part of another's: {inside}"
    tabled = [rules.message for rules in CEL_CASES]
    assert len(tabled) == len(set(tabled)), "one table entry per rule"
    assert sorted(tabled) == sorted(messages), (
        "add cases to tests/support/cel_cases.py for every CelRule, and only for those"
    )
    for rules in CEL_CASES:
        assert rules.good, f"{rules.name} has no manifest it accepts"
        assert rules.bad, f"{rules.name} has no manifest it rejects"
    ids = [case.id for case in flat_cases()]
    assert len(ids) == len(set(ids))


def rule_errors(error: ValidationError) -> list[str]:
    """What each error of a validation says: the rule's message for a failed CelRule."""
    return [
        str(e["ctx"]["error"]) if e["type"] == "value_error" else f"{e['type']}: {e['msg']}" for e in error.errors()
    ]


@pytest.mark.parametrize("case", flat_cases(), ids=lambda case: case.id)
def test_pydantic_agrees_with_the_table(case: Case) -> None:
    resource = RESOURCES[case.manifest["kind"]]
    if case.rejected_with is None:
        resource.model_validate(case.manifest)
        return
    with pytest.raises(ValidationError) as info:
        resource.model_validate(case.manifest)
    assert rule_errors(info.value) == [case.rejected_with]


def test_the_first_rule_that_fails_is_reported() -> None:
    """Rules of one model are checked in declaration order; the API server would report both."""
    source = {"uri": "ftp://host/m", "credentialsSecret": "tok"}
    with pytest.raises(ValidationError) as info:
        AIModel.model_validate({"metadata": {"name": "m"}, "spec": {"source": source}})
    assert rule_errors(info.value) == [ModelSource.cel_rules[0].message]
    assert ModelSource.cel_rules[0].message.startswith("source.uri must be")


def test_rules_land_in_the_json_schema_of_their_model() -> None:
    schema = Rollout.model_json_schema(by_alias=True)
    assert schema[CEL_KEY] == [rule.to_schema() for rule in Rollout.cel_rules]
    assert CEL_KEY not in AIModel.model_json_schema(by_alias=True)["$defs"]["EngineOptions"]
