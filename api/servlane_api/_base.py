"""Base model for the custom resources' schemas: camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Every API type: camelCase JSON aliases, unknown fields ignored (the CRD schema prunes them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_api(self) -> dict[str, object]:
        """The object as the API server holds it: camelCase, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ApiObject(ApiModel):
    """A whole custom resource as read from the API server; metadata stays a plain dict."""

    api_version: str = "servlane.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def created_unix(self) -> int:
        """metadata.creationTimestamp in Unix seconds (OpenAI's `created` of a model); 0 when the object has
        none or one that does not parse (a manifest not read from the API server)."""
        stamp = self.metadata.get("creationTimestamp")
        if isinstance(stamp, datetime):  # YAML reads an unquoted timestamp as one
            moment = stamp
        else:
            try:
                moment = datetime.fromisoformat(str(stamp))
            except ValueError:
                return 0
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return max(0, int(moment.timestamp()))
