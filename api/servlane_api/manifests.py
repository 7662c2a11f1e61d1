"""Reading a manifest into Servlane's types, one way for every process that reads them: the operator (from
the API server), the gateway (from its watch or a file) and the CLI (`servlane serve`'s files).

An invalid object is described as `<field path>: <what is wrong>` (pydantic's first error), so each
reader can say it in its own place (a PermanentError, a log line, a CLI error) with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

from pydantic import ValidationError

from servlane_api import API_VERSION
from servlane_api.aifeature import AIFeature
from servlane_api.aimodel import AIModel
from servlane_api.structural import structural_problems

_Resource = TypeVar("_Resource", AIModel, AIFeature)


class InvalidManifest(ValueError):
    def __init__(self, kind: str, name: str | None, problem: str) -> None:
        super().__init__(f"invalid {kind} {name!r}: {problem}" if name else f"invalid {kind}: {problem}")
        self.kind, self.name, self.problem = kind, name, problem


def describe(exc: ValidationError) -> str:
    """The first problem of a validation error as `field.path[index]: message` (the message alone at the top),
    its path written as the API server writes one (structural.py's too)."""
    error = exc.errors()[0]
    where = ""
    for part in error.get("loc", ()):
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    message = str(error["msg"])
    if error.get("type") == "value_error":  # one of our rules: its words alone, not pydantic's prefix
        message = message.removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def parse_model(raw: Mapping[str, Any]) -> AIModel:
    """An AIModel from its manifest; raises InvalidManifest."""
    return _parse(AIModel, raw)


def parse_feature(raw: Mapping[str, Any]) -> AIFeature:
    """An AIFeature from its manifest; raises InvalidManifest."""
    return _parse(AIFeature, raw)


def parse_resource(raw: Mapping[str, Any]) -> AIModel | AIFeature | None:
    """The typed object of a manifest of one of our kinds, None for any other kind; raises InvalidManifest."""
    kind = raw.get("kind")
    if kind == "AIModel":
        return parse_model(raw)
    if kind == "AIFeature":
        return parse_feature(raw)
    return None


def check_manifest_file_object(raw: Mapping[str, Any]) -> None:
    """For an AIModel or AIFeature read from a file rather than from the API server: InvalidManifest naming every
    problem (the first few) the API server would refuse it for before any rule of ours runs (its apiVersion, an
    unknown field, a value of the wrong JSON type, a name no object may have; see structural.py), which pydantic
    alone lets through."""
    kind = str(raw.get("kind"))
    problems = []
    if raw.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION}, not {str(raw.get('apiVersion'))[:80]!r}")
    problems += structural_problems(raw, _schema_of_kind(kind))
    if problems:
        name = (raw.get("metadata") or {}).get("name") if isinstance(raw.get("metadata"), dict) else None
        shown = "; ".join(problems[:_PROBLEMS_SHOWN])
        more = f" (and {len(problems) - _PROBLEMS_SHOWN} more)" if len(problems) > _PROBLEMS_SHOWN else ""
        raise InvalidManifest(kind, str(name) if name else None, shown + more)


def parse_manifest_file_object(raw: Mapping[str, Any]) -> AIModel | AIFeature | None:
    """parse_resource for an object read from a file: first check_manifest_file_object."""
    if raw.get("kind") not in ("AIModel", "AIFeature"):
        return None
    check_manifest_file_object(raw)
    return parse_resource(raw)


_PROBLEMS_SHOWN = 5


@cache
def _schema_of_kind(kind: str) -> dict[str, Any]:
    from servlane_api.crdgen import all_crds  # the generator is only needed here, once

    for crd in all_crds().values():
        if crd["spec"]["names"]["kind"] == kind:
            return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    raise KeyError(kind)


def _parse(cls: type[_Resource], raw: Mapping[str, Any]) -> _Resource:
    try:
        return cls.model_validate(dict(raw))
    except ValidationError as exc:
        name = (raw.get("metadata") or {}).get("name")
        raise InvalidManifest(cls.__name__, str(name) if name else None, describe(exc)) from exc
