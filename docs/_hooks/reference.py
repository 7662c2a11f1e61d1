"""MkDocs hook: the AIModel and AIFeature reference, generated from the pydantic models at every build.

A page holds a marker such as `<!-- servlane-reference: AIModelSpec -->`; the hook replaces it with one table
row per field (its path under the resource, type, default and description), read from the same structural
schema `servlane-gencrds` writes into the CRDs (`servlane_api.crdgen.schema_of`), and with the rules the API
server enforces (CEL messages). So the reference cannot drift from the API: a field added to the models is on
the next build's page, and an unknown marker fails the build.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_api.aimodel import AIModelSpec, AIModelStatus
from servlane_api.cel import CEL_KEY
from servlane_api.crdgen import schema_of

MODELS: dict[str, type[BaseModel]] = {
    "AIModelSpec": AIModelSpec,
    "AIModelStatus": AIModelStatus,
    "AIFeatureSpec": AIFeatureSpec,
    "AIFeatureStatus": AIFeatureStatus,
}
MARKER = re.compile(r"<!--\s*servlane-reference:\s*(\S+)\s*-->")
LONG_DEFAULT = 60  # characters: a longer default is that of its fields, listed below it


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda match: reference(match.group(1)), markdown)


def reference(name: str) -> str:
    """The field table and the rules of one model, as Markdown."""
    if name not in MODELS:
        raise ValueError(f"servlane-reference: unknown model {name!r}; known: {', '.join(MODELS)}")
    model = MODELS[name]
    root = "spec" if name.endswith("Spec") else "status"
    schema = schema_of(model)
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    rules: list[tuple[str, str]] = []
    _walk(schema, root, rows, rules)
    out = "\n".join(rows)
    if rules:
        out += "\n\n**Rules** the API server enforces (a manifest that breaks one is refused with its message):\n\n"
        out += "\n".join(f"- `{path}`: {_cell(message)}" for path, message in rules)
    return out


def _walk(schema: dict[str, Any], path: str, rows: list[str], rules: list[tuple[str, str]]) -> None:
    rules.extend((path, rule["message"]) for rule in schema.get(CEL_KEY, []))
    required = set(schema.get("required", []))
    for key, prop in schema.get("properties", {}).items():
        child = f"{path}.{key}"
        name = f"`{child}`" + (" (required)" if key in required else "")
        rows.append(f"| {name} | {_type(prop)} | {_default(prop)} | {_cell(prop.get('description', ''))} |")
        nested = prop
        suffix = ""
        while "properties" not in nested and ("items" in nested or _is_map(nested)):
            if "items" in nested:
                nested, suffix = nested["items"], suffix + "[]"
            else:
                nested, suffix = nested["additionalProperties"], suffix + "{}"
        if "properties" in nested or CEL_KEY in nested:
            _walk(nested, child + suffix, rows, rules)


def _is_map(prop: dict[str, Any]) -> bool:
    return isinstance(prop.get("additionalProperties"), dict)


def _type(prop: dict[str, Any]) -> str:
    kind = str(prop.get("type", "any"))
    if kind == "array":
        kind = f"list of {_type(prop.get('items', {}))}"
    elif kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        kind = f"map of {_type(prop['additionalProperties'])}"
    if "enum" in prop:
        kind += ": " + ", ".join(f"`{value}`" for value in prop["enum"])
    bounds = [
        f"{label} {prop[key]}"
        for key, label in (("minimum", "≥"), ("maximum", "≤"), ("maxLength", "length ≤"), ("maxItems", "items ≤"))
        if key in prop
    ]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    text = json.dumps(prop["default"], separators=(", ", ": "))
    return "(each field's)" if len(text) > LONG_DEFAULT else f"`{_cell(text)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
