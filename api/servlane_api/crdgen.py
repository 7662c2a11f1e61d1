"""Generates crds/*.yaml from the pydantic models: `servlane-gencrds [--check] [DIR]`.

pydantic emits JSON Schema with $refs, anyOf-for-Optional and titles; Kubernetes wants a structural
OpenAPI v3 schema with everything inlined. `structural()` does that conversion.

Defaults come from the models themselves, not from pydantic's JSON Schema (which leaves out every
`default_factory`): `write_defaults()` gives each field that has a default in pydantic the same value,
written as pydantic fills it in, at its own level. The API server defaults an absent field only from
the `default` of that very field, so a parent's default covers an absent parent and nothing else:
`rollout: {interval: 30s}` gets its `steps` from the default on `steps`, not from the one on `rollout`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from servlane_api import GROUP, VERSION
from servlane_api.aifeature import AIFeature, AIFeatureSpec, AIFeatureStatus
from servlane_api.aimodel import AIModel, AIModelSpec, AIModelStatus
from servlane_api.cel import CEL_KEY, CelValidated, models_in

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
    "minProperties",
    "maxProperties",
    "format",
    CEL_KEY,
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


def _bare_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = structural(raw, raw.get("$defs", {}))
    _drop_defaults(schema)
    return schema


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a spec model, with every default pydantic has, at every level."""
    schema = _bare_schema(model)
    write_defaults(schema, model)
    return schema


def _drop_defaults(schema: dict[str, Any]) -> None:
    schema.pop("default", None)
    for sub in _children(schema):
        _drop_defaults(sub)


def _children(schema: dict[str, Any]) -> list[dict[str, Any]]:
    nested = list(schema.get("properties", {}).values())
    nested += [schema[key] for key in ("items", "additionalProperties") if isinstance(schema.get(key), dict)]
    return nested


def field_default(field: FieldInfo) -> Any:
    """A field's default as the API server should write it (camelCase JSON, unset optionals left out);
    None when the field is required or defaults to absent."""
    if field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    if value is None:
        return None
    annotation: Any = field.annotation
    return TypeAdapter(annotation).dump_python(value, mode="json", by_alias=True, exclude_none=True)


def write_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Gives every field of `model`, and of the models nested in it, its pydantic default in `schema`."""
    for name, field in model.model_fields.items():
        prop = schema["properties"][field.alias or name]
        default = field_default(field)
        if default is not None:
            prop["default"] = default
        for nested in models_in(field.annotation):
            write_defaults(_object_node(prop), nested)


def _object_node(schema: dict[str, Any]) -> dict[str, Any]:
    """The object schema of a model-typed field, through list items and map values."""
    while "properties" not in schema:
        schema = schema["items"] if "items" in schema else schema["additionalProperties"]
    return schema


def crd(
    resource: type[CelValidated],
    plural: str,
    short_names: list[str],
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    scale: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The CRD of `resource`, whose own CEL rules (on metadata) go to the root of the schema; `scale`: its
    scale subresource's paths, if it has one."""
    kind = resource.__name__
    subresources: dict[str, Any] = {"status": {}}
    if scale is not None:
        subresources["scale"] = scale
    root_rules = [rule.to_schema() for rule in resource.cel_rules]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "servlane"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["servlane", "ai"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            CEL_KEY: root_rules,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": schema_of(spec),
                                # Status is written by the operator alone; defaults there would only add noise.
                                "status": _bare_schema(status),
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
AIMODEL_SCALE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def all_crds() -> dict[str, dict[str, Any]]:
    """File name → CRD object."""
    return {
        "aimodels.yaml": crd(
            AIModel,
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
                # The last pod start, created to Ready (status.coldStart: each step of it in `kubectl describe`).
                _col("Cold start", ".status.coldStart.last.total", "number", priority=1),
                _col("Scaling", ".status.autoscaler.reason", priority=1),
                AGE,
            ],
            # `kubectl scale aimodel`, an HPA or KEDA write spec.replicas; the operator writes the selector.
            scale=AIMODEL_SCALE,
        ),
        "aifeatures.yaml": crd(
            AIFeature,
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
    header = "# Generated by `servlane-gencrds` from api/servlane_api; do not edit by hand.\n"
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
