"""The CRDs in crds/ are generated from the pydantic models and must not drift from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servlane_api.crdgen import all_crds, main, render

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_match_the_models() -> None:
    assert main(["--check", str(ROOT / "crds")]) == 0, "run `make crds` and commit the result"


def test_check_fails_on_drift(tmp_path: Path) -> None:
    main([str(tmp_path)])
    assert main(["--check", str(tmp_path)]) == 0
    path = tmp_path / "aimodels.yaml"
    path.write_text(path.read_text().replace("maxReplicas", "maxReplica"))
    assert main(["--check", str(tmp_path)]) == 1


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_schemas_are_structural() -> None:
    for name, crd in all_crds().items():
        version = crd["spec"]["versions"][0]
        assert version["subresources"]["status"] == {}
        for path, node in walk(version["schema"]["openAPIV3Schema"]):
            assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs"} & node.keys(), f"{name}{path}"
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{name}{path} has no type"


def test_printer_columns_and_names() -> None:
    model = all_crds()["aimodels.yaml"]["spec"]
    columns = [c["name"] for c in model["versions"][0]["additionalPrinterColumns"]]
    assert columns[:5] == ["Engine", "GPUs", "Ready", "Desired", "Phase"]
    assert "Age" in columns
    assert model["names"]["shortNames"] == ["aim", "aimodel"]
    assert "servlane" in model["names"]["categories"]
    feature = all_crds()["aifeatures.yaml"]["spec"]
    columns = [c["name"] for c in feature["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Stable", "Canary", "Weight", "Phase"]


def test_rendered_yaml_round_trips() -> None:
    for crd in all_crds().values():
        assert yaml.safe_load(render(crd)) == crd


def test_an_aimodel_can_be_scaled_through_its_scale_subresource() -> None:
    """`kubectl scale aimodel`, an HPA or KEDA write spec.replicas; the operator reports pods and selector."""
    crds = all_crds()
    assert crds["aimodels.yaml"]["spec"]["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "scale" not in crds["aifeatures.yaml"]["spec"]["versions"][0]["subresources"]
