"""The env the operator owns on model pods: listed once (servlane_api.pod_env), written by the Deployment
builder, refused in spec.env at admission (tests/support/cel_cases.py), and never sent twice to server-side apply."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from servlane_api.aimodel import EnvVar
from servlane_api.pod_env import RESERVED_ENV_NAMES
from servlane_operator.builders import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model

SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers"}


def env_of(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: list[dict[str, Any]] = container["env"]
    return env


def test_the_reserved_names_are_exactly_what_the_builder_sets(settings: OperatorSettings) -> None:
    names = [e["name"] for e in env_of(build_deployment(make_model(SPEC), settings))]
    assert names == list(RESERVED_ENV_NAMES)


@pytest.mark.parametrize("name", RESERVED_ENV_NAMES)
def test_admission_twin_refuses_a_reserved_name(name: str) -> None:
    with pytest.raises(ValidationError, match=f"env must not set .*{name}"):
        make_model({**SPEC, "env": [{"name": name, "value": "x"}]})


def test_a_model_that_got_past_admission_never_yields_a_repeated_name(settings: OperatorSettings) -> None:
    """Stored before the rules existed: ours win, and of the user's repeats the last, as the kubelet does."""
    model = make_model(SPEC)
    ours = {e["name"]: e["value"] for e in env_of(build_deployment(model, settings))}
    model.spec.env = [
        EnvVar(name="HOME", value="/root"),
        EnvVar(name="A", value="1"),
        EnvVar(name="SERVLANE_RUNTIME_CONFIG", value="{}"),
        EnvVar(name="A", value="2"),
    ]
    env = env_of(build_deployment(model, settings))
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    assert {e["name"]: e["value"] for e in env} == {**ours, "A": "2"}
