"""CEL validation rules, each declared once with its Python twin.

A `CelRule` carries the CEL text the API server evaluates on the camelCase object, the message a person
reads, and the same predicate on the typed pydantic model. A `CelValidated` model lists its rules in
`cel_rules`: the CRD generator copies them into the schema's `x-kubernetes-validations`, and the model's
one after-validator rejects, with the same message, what the API server would reject. So typed code
(standalone mode, the operator, tests) and the API server agree, and a rule cannot be added on one side only.

CEL's `has(self.x)` means "present after defaulting": `self.x is not None` for an optional field, always
true for a nested object that has a default.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.config import JsonDict, JsonValue

from servlane_api._base import ApiModel, ApiObject

CEL_KEY = "x-kubernetes-validations"

M = TypeVar("M", contravariant=True)


@dataclass(frozen=True)
class CelRule(Generic[M]):
    """One CEL validation rule and its twin: `holds(model)` is true exactly when `rule` is."""

    rule: str
    message: str
    holds: Callable[[M], bool]

    def to_schema(self) -> JsonDict:
        """The rule as an `x-kubernetes-validations` entry."""
        return {"rule": self.rule, "message": self.message}


def _write_rules(schema: JsonDict, cls: type[BaseModel]) -> None:
    rules: tuple[CelRule[Any], ...] = getattr(cls, "cel_rules", ())
    if rules:
        validations: list[JsonValue] = [rule.to_schema() for rule in rules]
        schema[CEL_KEY] = validations


class CelValidated(ApiModel):
    """An API type with CEL rules: declared once in `cel_rules`, enforced by the API server and by pydantic."""

    model_config = ConfigDict(json_schema_extra=_write_rules)

    cel_rules: ClassVar[tuple[CelRule[Self], ...]] = ()

    @model_validator(mode="after")
    def _cel_rules_hold(self) -> Self:
        for rule in self.cel_rules:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self


def max_name_length(limit: int) -> CelRule[ApiObject]:
    """A rule for the root of a resource's schema: metadata.name is at most `limit` characters."""
    return CelRule(
        f"self.metadata.name.size() <= {limit}",
        f"metadata.name must be at most {limit} characters",
        lambda obj: len(str(obj.metadata.get("name", ""))) <= limit,
    )


# A DNS-1035 label, as a Service's name must be: lowercase letters, digits and '-', a letter first, no '-' last.
DNS_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


def dns_label_name(what: str) -> CelRule[ApiObject]:
    """A rule for the root of a resource's schema: metadata.name is a DNS-1035 label, as the name of the
    objects made from it (`what`) must be. A custom resource's name may hold dots (a DNS subdomain), so without
    this rule the resource was admitted and its Service then refused. The twin lets an object without a name
    pass (one built in memory, never sent): the API server always has one."""
    return CelRule(
        f"self.metadata.name.matches('{DNS_LABEL}')",
        f"metadata.name must consist of lowercase letters, digits and '-', start with a letter and end with a "
        f"letter or digit (it names the {what})",
        lambda obj: not obj.metadata.get("name") or re.fullmatch(DNS_LABEL, str(obj.metadata["name"])) is not None,
    )


def declared_rules(model: type[BaseModel]) -> list[tuple[type[CelValidated], CelRule[Any]]]:
    """Every CEL rule on `model` and on the models its fields reach, with the model that declares it."""
    found: list[tuple[type[CelValidated], CelRule[Any]]] = []
    seen: set[type[BaseModel]] = set()

    def visit(cls: type[BaseModel]) -> None:
        if cls in seen:
            return
        seen.add(cls)
        if issubclass(cls, CelValidated):
            found.extend((cls, rule) for rule in cls.cel_rules)
        for field in cls.model_fields.values():
            for sub in models_in(field.annotation):
                visit(sub)

    visit(model)
    return found


def models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models inside a field's type: list[X], X | None, dict[str, X], Annotated[X, ...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in getattr(annotation, "__args__", ()) for model in models_in(arg)]
