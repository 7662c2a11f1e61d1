"""What the API server refuses in a manifest before any rule of ours runs: a field its CRD's structural schema
does not have, and a value of the wrong JSON type. Standalone mode reads manifests from files with no API server
in front, and pydantic is lax where the API server is not (`replicas: "2"` is an integer to pydantic, a
refusal to the API server; `replica: 2` is ignored by pydantic, an error to `kubectl apply`'s strict field
validation). Checking the same schema the CRD carries keeps one manifest valid in both places or in neither.

Pure: a manifest and a schema in, the problems out, in the API server's terms.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from servlane_api.kube_labels import DNS_LABEL_1123, DNS_SUBDOMAIN

# ObjectMeta's fields (k8s.io/apimachinery/pkg/apis/meta/v1): the CRD's schema says only `type: object` for
# metadata, and the API server checks it against these.
_METADATA_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_STRING_MAPS = ("labels", "annotations")

_JSON_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def structural_problems(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Each unknown field and wrongly typed value of `obj` against a CRD's openAPIV3Schema, as
    `path: what is wrong`, in document order. `status` is not checked (the API server ignores it on create)."""
    problems: list[str] = []
    properties = schema.get("properties", {})
    for key, value in obj.items():
        if key == "status":
            continue
        if key == "metadata":
            _check_metadata(value, problems)
        elif key in properties:
            _check(value, properties[key], key, problems)
        else:
            problems.append(_unknown(key))
    return problems


_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
_DNS_LABEL = re.compile(DNS_LABEL_1123)


def _names_an_object(text: str, key: str) -> bool:
    """The API server's rule for every object's name (a DNS-1123 subdomain) and namespace (a DNS-1123 label)."""
    if key == "namespace":
        return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None
    return len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def _check(value: Any, schema: Mapping[str, Any], path: str, problems: list[str]) -> None:
    if value is None:  # the API server prunes a null before defaulting; the model then says if it is required
        return
    if not _has_type(value, schema):
        problems.append(f"{path}: must be {_expected(schema)}, not {_describe(value)}")
        return
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        properties = schema.get("properties")
        values_schema = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}"
            if properties is not None and key in properties:
                _check(item, properties[key], where, problems)
            elif isinstance(values_schema, Mapping):
                _check(item, values_schema, where, problems)
            elif properties is not None:
                problems.append(_unknown(where))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{index}]", problems)


def _has_type(value: Any, schema: Mapping[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    kind = schema.get("type")
    if kind is None:
        return True
    if kind == "integer":
        # YAML's 2.0 reaches the API server as 2 through kubectl (sigs.k8s.io/yaml writes a whole float64 as an
        # integer); 2.5 is refused.
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    expected = {"string": str, "boolean": bool, "object": dict, "array": list}.get(kind)
    return expected is None or isinstance(value, expected)


def _expected(schema: Mapping[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "an integer or a string"
    return {
        "integer": "an integer",
        "number": "a number",
        "string": "a string",
        "boolean": "a boolean (true or false, unquoted)",
        "object": "an object (a mapping of fields)",
        "array": "a list",
    }.get(str(schema.get("type")), str(schema.get("type")))


def _describe(value: Any) -> str:
    kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else None
    if shown is not None and len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} ({shown})" if shown is not None else kind


def _unknown(path: str) -> str:
    return f"{path}: unknown field (the API server refuses it under kubectl's strict field validation)"


def _check_metadata(value: Any, problems: list[str]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        problems.append(f"metadata: must be an object (a mapping of fields), not {_describe(value)}")
        return
    for key, item in value.items():
        if key not in _METADATA_FIELDS:
            problems.append(_unknown(f"metadata.{key}"))
        elif key in _STRING_MAPS and item is not None:
            if not isinstance(item, dict):
                problems.append(f"metadata.{key}: must be an object (a mapping of fields), not {_describe(item)}")
                continue
            for name, text in item.items():
                if not isinstance(text, str):
                    problems.append(f"metadata.{key}.{name}: must be a string (quote it), not {_describe(text)}")
        elif key in ("name", "namespace", "generateName") and item is not None and not isinstance(item, str):
            problems.append(f"metadata.{key}: must be a string, not {_describe(item)}")
        elif key in ("name", "namespace") and isinstance(item, str) and not _names_an_object(item, key):
            # Every object's rule, whatever its kind (a Service's name would be stricter still).
            what = "a DNS label" if key == "namespace" else "a DNS subdomain"
            problems.append(
                f"metadata.{key}: {item[:80]!r} is not {what} (lowercase letters, digits, '-' and '.', beginning and "
                "ending with a letter or digit)"
            )
