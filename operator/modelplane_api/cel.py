"""CEL validation rules attached to API models; the CRD generator copies them into the schema."""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.config import JsonValue

from modelplane_api._base import ApiModel

CEL_KEY = "x-kubernetes-validations"


def cel_rules(*rules: tuple[str, str]) -> ConfigDict:
    """A model config whose JSON schema carries these (rule, message) pairs as CEL validations."""
    validations: list[JsonValue] = [{"rule": rule, "message": message} for rule, message in rules]
    config = ApiModel.model_config.copy()
    config["json_schema_extra"] = {CEL_KEY: validations}
    return config
