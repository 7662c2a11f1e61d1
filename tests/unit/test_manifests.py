"""Reading manifests (servlane_api.manifests): one type per kind and one wording of what is wrong, shared by
the operator, the gateway and the CLI."""

from __future__ import annotations

import re
from typing import Any

import kopf
import pytest

from servlane_api import AIFeature, AIModel
from servlane_api.manifests import InvalidManifest, parse_resource
from servlane_cli.manifests import ManifestError, load_manifests
from servlane_gateway.routing.sources import parse_object
from servlane_operator.aimodel_reconciler import parse_model


def model(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "servlane.dev/v1alpha1", "kind": "AIModel", "metadata": {"name": "m"}, "spec": spec}


BAD_BOUNDS = {"source": {"uri": "/models/x"}, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}


def test_each_kind_is_read_into_its_type_and_another_kind_is_not_ours() -> None:
    assert isinstance(parse_resource(model({"source": {"uri": "/models/x"}})), AIModel)
    feature = {"kind": "AIFeature", "metadata": {"name": "chat"}, "spec": {"model": "m"}}
    assert isinstance(parse_resource(feature), AIFeature)
    assert parse_resource({"kind": "ConfigMap", "metadata": {"name": "x"}}) is None


def test_an_invalid_manifest_says_which_object_which_field_and_what_is_wrong() -> None:
    with pytest.raises(InvalidManifest) as caught:
        parse_resource(model({"source": {"uri": "/models/x"}, "replicas": -1}))
    assert (caught.value.kind, caught.value.name) == ("AIModel", "m")
    assert caught.value.problem.startswith("spec.replicas: ")
    assert str(caught.value).startswith("invalid AIModel 'm': spec.replicas: ")


def test_the_operator_the_gateway_and_the_cli_say_the_same_words(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(InvalidManifest) as shared:
        parse_resource(model(BAD_BOUNDS))
    problem = shared.value.problem
    with pytest.raises(kopf.PermanentError, match=re.escape(problem)):
        parse_model(model(BAD_BOUNDS))
    assert parse_object(model(BAD_BOUNDS)) is None  # the gateway logs it and goes on
    assert problem in caplog.text
    file = tmp_path / "models.yaml"
    file.write_text(
        "apiVersion: servlane.dev/v1alpha1\nkind: AIModel\nmetadata: {name: m}\n"
        "spec: {source: {uri: /models/x}, autoscaling: {minReplicas: 3, maxReplicas: 2}}\n"
    )
    with pytest.raises(ManifestError, match=re.escape(problem)):
        load_manifests([file])
