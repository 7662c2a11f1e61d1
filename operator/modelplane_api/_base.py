"""Base model for the custom resources' schemas: camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict


class ApiModel(BaseModel):
    """Every API type: camelCase JSON aliases, unknown fields ignored (the CRD schema prunes them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_api(self) -> dict[str, object]:
        """The object as the API server holds it: camelCase, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def defaults_of(model: type[ApiModel]) -> JsonDict:
    """JSON-schema extra for a nested object field: its default is the model's own defaults, written out.

    The API server applies nested defaults only when the object exists, and validates CEL rules
    against the default itself, so the default has to be complete rather than {}.
    """
    return {"default": model().model_dump(by_alias=True, exclude_none=True, mode="json")}


class ApiObject(ApiModel):
    """A whole custom resource as read from the API server; metadata stays a plain dict."""

    api_version: str = "modelplane.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))
