"""Generates crds/*.yaml from the pydantic models: `modelplane-gencrds [--check] [DIR]`.

pydantic emits JSON Schema with $refs, anyOf-for-Optional and titles; Kubernetes wants a structural
OpenAPI v3 schema with everything inlined. `structural()` does that conversion.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from modelplane_api import GROUP, VERSION
from modelplane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from modelplane_api.aimodel import MAX_MODEL_NAME, AIModelSpec, AIModelStatus

# Keys of JSON Schema that a structural schema keeps as they are.
_KEEP = {
    "type",
    "description",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
    "x-kubernetes-validations",
}


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $refs, unwrap Optional, keep only the keys a structural schema allows."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than Optional are not structural: {schema}")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return structural({**options[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _KEEP:
            out[key] = value
    # pydantic's exclusive bounds are numbers (draft 2020-12); OpenAPI v3 wants booleans.
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out:
            out[flag] = out.pop(bound)
            out[bound] = True
    if "const" in schema:
        out["enum"] = [schema["const"]]
        out.setdefault("type", "string")
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        out["type"] = "object"
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props:
            out["properties"] = {name: structural(sub, defs) for name, sub in props.items()}
            if schema.get("required"):
                out["required"] = list(schema["required"])
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural(extra, defs)
        else:
            # A free-form object (affinity, valueFrom): kept as given, validated by Kubernetes downstream.
            out["x-kubernetes-preserve-unknown-fields"] = True
    if kind == "array":
        out["items"] = structural(schema["items"], defs)
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def _status_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = schema_of(model)
    # Status is written by the operator alone; defaults there would only add noise.
    _drop_defaults(schema)
    return schema


def _drop_defaults(schema: dict[str, Any]) -> None:
    schema.pop("default", None)
    for sub in schema.get("properties", {}).values():
        _drop_defaults(sub)
    if isinstance(schema.get("items"), dict):
        _drop_defaults(schema["items"])


def crd(
    kind: str,
    plural: str,
    short_names: list[str],
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    max_name_length: int = 253,
) -> dict[str, Any]:
    root_rules = [
        {
            "rule": f"self.metadata.name.size() <= {max_name_length}",
            "message": f"metadata.name must be at most {max_name_length} characters",
        }
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "modelplane"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["modelplane", "ai"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "x-kubernetes-validations": root_rules,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": schema_of(spec),
                                "status": _status_schema(status),
                            },
                        }
                    },
                }
            ],
        },
    }


def _col(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


AGE = _col("Age", ".metadata.creationTimestamp", "date")


def all_crds() -> dict[str, dict[str, Any]]:
    """File name → CRD object."""
    return {
        "aimodels.yaml": crd(
            "AIModel",
            "aimodels",
            ["aim", "aimodel"],
            AIModelSpec,
            AIModelStatus,
            [
                _col("Engine", ".spec.engine"),
                _col("GPUs", ".spec.resources.gpus", "integer"),
                _col("Ready", ".status.readyReplicas", "integer"),
                _col("Desired", ".status.desiredReplicas", "integer"),
                _col("Phase", ".status.phase"),
                _col("Model", ".spec.source.uri", priority=1),
                _col("Endpoint", ".status.endpoint", priority=1),
                AGE,
            ],
            max_name_length=MAX_MODEL_NAME,
        ),
        "aifeatures.yaml": crd(
            "AIFeature",
            "aifeatures",
            ["aif", "aifeature"],
            AIFeatureSpec,
            AIFeatureStatus,
            [
                _col("Stable", ".status.stableModel"),
                _col("Canary", ".status.canaryModel"),
                _col("Weight", ".status.canaryWeight", "integer"),
                _col("Phase", ".status.phase"),
                _col("Target", ".spec.model", priority=1),
                AGE,
            ],
        ),
    }


def render(obj: dict[str, Any]) -> str:
    header = "# Generated by `modelplane-gencrds` from operator/modelplane_api; do not edit by hand.\n"
    return header + yaml.safe_dump(obj, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="*", type=Path, default=[Path("crds")])
    parser.add_argument("--check", action="store_true", help="fail if the files differ instead of writing")
    args = parser.parse_args(argv)
    stale: list[Path] = []
    for directory in args.dirs:
        for name, obj in all_crds().items():
            path = directory / name
            text = render(obj)
            if path.exists() and path.read_text() == text:
                continue
            if args.check:
                stale.append(path)
            else:
                directory.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print("CRDs out of date, run `make crds`: " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
