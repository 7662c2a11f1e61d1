"""Manifests read from files (standalone mode) are refused where the API server refuses them: the shared table
of tests/support/structural_cases.py, whose API server half is e2e/test_structural_parity.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servlane_api.manifests import InvalidManifest, parse_manifest_file_object, parse_resource
from servlane_cli.manifests import ManifestError, load_manifests
from tests.support.structural_cases import STRUCTURAL_CASES, StructuralCase


@pytest.mark.parametrize("case", STRUCTURAL_CASES, ids=lambda case: case.id)
def test_a_file_object_is_refused_where_the_api_server_refuses_it(case: StructuralCase) -> None:
    if case.refused_at is None:
        assert parse_manifest_file_object(case.manifest) is not None
        return
    with pytest.raises(InvalidManifest) as info:
        parse_manifest_file_object(case.manifest)
    assert info.value.problem.startswith(f"{case.refused_at}: "), info.value.problem


@pytest.mark.parametrize(
    "case", [case for case in STRUCTURAL_CASES if case.id in ("quoted-integer", "unknown-spec-field")], ids=str
)
def test_pydantic_alone_would_have_let_it_through(case: StructuralCase) -> None:
    """Why the check exists: the typed models read these (lax types, unknown fields ignored)."""
    assert parse_resource(case.manifest) is not None


def test_the_message_names_the_value_and_counts_what_it_leaves_out() -> None:
    spec = {"source": {"uri": "/m"}, **{f"typo{i}": 1 for i in range(7)}, "replicas": "2"}
    manifest = {"apiVersion": "servlane.dev/v1alpha1", "kind": "AIModel", "metadata": {"name": "m"}, "spec": spec}
    with pytest.raises(InvalidManifest) as info:
        parse_manifest_file_object(manifest)
    assert info.value.problem.count("unknown field") == 5
    assert info.value.problem.endswith("(and 3 more)")


def test_other_kinds_are_left_to_their_readers() -> None:
    assert parse_manifest_file_object({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": 1}}) is None


def test_standalone_mode_refuses_a_typo_in_a_yaml_file(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "servlane.dev/v1alpha1",
                "kind": "AIModel",
                "metadata": {"name": "chat"},
                "spec": {"source": {"uri": "/m"}, "resources": {"gpu": 1}},
            }
        )
    )
    with pytest.raises(ManifestError, match=r"m\.yaml: AIModel 'chat': spec\.resources\.gpu: unknown field"):
        load_manifests([tmp_path])
