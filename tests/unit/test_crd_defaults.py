"""The CRDs default every field that pydantic defaults, at its own level, so a partial object gets the same
values from the API server as from pydantic; and every field a CEL rule reads is there after defaulting.

e2e/test_crd_defaults.py applies the same partial manifests to a real API server.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel

from servlane_api.aifeature import AIFeature, AIFeatureSpec
from servlane_api.aimodel import AIModel, AIModelSpec
from servlane_api.cel import CelRule, CelValidated, declared_rules, models_in
from servlane_api.crdgen import all_crds, field_default
from tests.support.crd_defaulting import apply_defaults
from tests.support.defaulting_cases import PARTIAL_MANIFESTS, Partial

SPECS: dict[str, tuple[type[CelValidated], type[BaseModel], str]] = {
    "AIModel": (AIModel, AIModelSpec, "aimodels.yaml"),
    "AIFeature": (AIFeature, AIFeatureSpec, "aifeatures.yaml"),
}


def spec_schema(kind: str) -> dict[str, Any]:
    crd = all_crds()[SPECS[kind][2]]
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def object_node(schema: dict[str, Any]) -> dict[str, Any]:
    while "properties" not in schema:
        schema = schema["items"] if "items" in schema else schema["additionalProperties"]
    return schema


def models_with_schemas(model: type[BaseModel], schema: dict[str, Any]) -> list[tuple[str, type[BaseModel], Any]]:
    """`model` and every model its fields reach, each with its object schema in the CRD and a readable path."""
    found: list[tuple[str, type[BaseModel], Any]] = [(model.__name__, model, schema)]
    for name, field in model.model_fields.items():
        prop = schema["properties"][field.alias or name]
        for nested in models_in(field.annotation):
            found += [
                (f"{model.__name__}.{path}", m, s) for path, m, s in models_with_schemas(nested, object_node(prop))
            ]
    return found


def every_model() -> list[tuple[str, type[BaseModel], Any]]:
    return [found for kind, (_, spec, _) in SPECS.items() for found in models_with_schemas(spec, spec_schema(kind))]


@pytest.mark.parametrize(("path", "model", "schema"), every_model(), ids=lambda x: x if isinstance(x, str) else "")
def test_an_absent_field_gets_the_pydantic_default_from_the_crd(
    path: str, model: type[BaseModel], schema: dict[str, Any]
) -> None:
    """At every level: an object with no fields set is defaulted by the CRD to exactly pydantic's defaults,
    and no field that pydantic leaves unset gets a value."""
    defaulted = apply_defaults({}, schema)
    expected = {}
    for name, field in model.model_fields.items():
        value = field_default(field)
        if value is not None:
            expected[field.alias or name] = value
    assert defaulted == expected, path


def test_the_walk_reaches_every_object_with_defaults() -> None:
    """The levels the issue was about are among those checked above."""
    paths = {path for path, _, _ in every_model()}
    assert {
        "AIFeatureSpec.Rollout",
        "AIFeatureSpec.Rollout.Analysis",
        "AIModelSpec.Autoscaling",
    } <= paths
    assert {"AIModelSpec.EngineOptions", "AIModelSpec.Resources", "AIModelSpec.Scheduling"} <= paths
    rollout = spec_schema("AIFeature")["properties"]["rollout"]["properties"]
    assert rollout["steps"]["default"] == [5, 25, 50, 100]


@pytest.mark.parametrize("case", PARTIAL_MANIFESTS, ids=lambda case: case.id)
def test_a_partial_spec_is_defaulted_like_pydantic(case: Partial) -> None:
    kind = case.manifest["kind"]
    resource = SPECS[kind][0]
    expected = resource.model_validate(case.manifest).to_api()["spec"]
    assert apply_defaults(case.manifest["spec"], spec_schema(kind)) == expected


def test_defaults_fill_what_was_left_out_and_keep_what_was_set() -> None:
    """The case of the issue, spelled out: a rollout with only `interval` keeps it and gets every other field."""
    spec = apply_defaults({"model": "m1", "rollout": {"interval": "30s"}}, spec_schema("AIFeature"))
    assert spec["rollout"]["interval"] == "30s"
    assert spec["rollout"]["steps"] == [5, 25, 50, 100]
    assert spec["rollout"]["analysis"]["minRequests"] == 20


# `self.a.b` in a CEL rule, with whether it is the argument of has() and whether a method call follows.
SELF_PATH = re.compile(r"(has\()?self((?:\.[A-Za-z_]\w*)+)(\()?")


def fields_read(rule: str) -> list[list[str]]:
    """The paths under `self` whose every step must be present for `rule` to evaluate."""
    paths = []
    for match in SELF_PATH.finditer(rule):
        steps = match.group(2).split(".")[1:]
        if match.group(3):
            steps = steps[:-1]  # self.steps.all(...): `all` is a method
        if match.group(1):
            steps = steps[:-1]  # has(self.a.b) tests b and reads a
        paths.append(steps)
    return paths


def present_after_defaulting(model: type[BaseModel], steps: list[str], rule: str) -> list[str]:
    """The steps of a path that may be absent when the rule runs: optional, no default, no has() guard."""
    missing: list[str] = []
    current: type[BaseModel] | None = model
    for depth, step in enumerate(steps, start=1):
        if current is None:
            break
        fields = {field.alias or name: field for name, field in current.model_fields.items()}
        field = fields[step]
        guarded = f"has(self.{'.'.join(steps[:depth])})" in rule
        if not (field.is_required() or field_default(field) is not None or guarded):
            missing.append(".".join(steps[:depth]))
        nested = models_in(field.annotation)
        current = nested[0] if nested else None
    return missing


def every_rule() -> list[tuple[type[CelValidated], CelRule[Any]]]:
    return [found for resource, _, _ in SPECS.values() for found in declared_rules(resource)]


@pytest.mark.parametrize(("owner", "rule"), every_rule(), ids=lambda x: x.message if isinstance(x, CelRule) else "")
def test_cel_rules_read_only_fields_that_are_there(owner: type[CelValidated], rule: CelRule[Any]) -> None:
    """A CEL rule that reads an absent field fails with "no such key" instead of its message: whatever a
    rule reads is required, defaulted, or guarded by has()."""
    missing = [path for steps in fields_read(rule.rule) for path in present_after_defaulting(owner, steps, rule.rule)]
    assert missing == [], f"{owner.__name__}: {rule.rule}"


def test_the_has_check_catches_an_unguarded_optional_field() -> None:
    assert present_after_defaulting(AIModelSpec, ["autoscaling", "maxReplicas"], "self.autoscaling.maxReplicas > 1")
    assert not present_after_defaulting(
        AIModelSpec, ["autoscaling", "maxReplicas"], "!has(self.autoscaling) || self.autoscaling.maxReplicas > 1"
    )
    assert fields_read("self.steps.all(s, s > 0)") == [["steps"]]
    assert fields_read("!has(self.a.b)") == [["a"]]
