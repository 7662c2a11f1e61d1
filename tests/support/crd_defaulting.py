"""What the API server does to an object with a CRD's defaults, for tests that run without one.

Kubernetes' structural defaulting: in an object, every absent property whose schema has a `default` gets a
copy of it; then each present value (defaults included) is defaulted by its own schema, through list items
and map values. e2e/test_crd_defaults.py checks the same expectations against a real API server.
"""

from __future__ import annotations

import copy
from typing import Any


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """A defaulted copy of `value` under the structural `schema`."""
    if isinstance(value, dict):
        out = dict(value)
        properties: dict[str, Any] = schema.get("properties", {})
        for name, sub in properties.items():
            if out.get(name) is None and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
        values = schema.get("additionalProperties")
        for name in out:
            sub_schema = properties.get(name, values if isinstance(values, dict) else None)
            if sub_schema is not None:
                out[name] = apply_defaults(out[name], sub_schema)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value
