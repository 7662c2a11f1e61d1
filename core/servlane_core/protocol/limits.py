"""What a request body may be before any model sees it: its size, its nesting and its lists.

Both servers read a body through these rules, so a request that is too big is a 413 and one that is
too deep, too long or not JSON is a 400, in the one error shape, before pydantic or an engine runs.
The JSON parser is pydantic's (Rust): it never recurses on Python's stack (so 5,000 nested arrays
cannot raise RecursionError), refuses lone UTF-16 surrogates (which tokenizers cannot encode) and
the non-JSON literals NaN and Infinity. Depth and list lengths are then checked by one iterative walk.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import from_json

from servlane_api.runtime_config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_LIST_ITEMS

from .errors import OpenAIError


class RequestLimits(BaseModel):
    """The caps on one request body; the defaults are generous for any real OpenAI request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, description="Largest request body in bytes; larger is a 413."
    )
    max_json_depth: int = Field(
        default=DEFAULT_MAX_JSON_DEPTH,
        ge=2,
        le=128,
        description="Deepest nesting of JSON objects and arrays; deeper is a 400.",
    )
    max_list_items: int = Field(
        default=DEFAULT_MAX_LIST_ITEMS,
        ge=1,
        description="Most items in any JSON array (messages, prompt, input, ...); more is a 400.",
    )


def body_too_large(max_bytes: int) -> OpenAIError:
    return OpenAIError(413, f"Request body too large: the limit is {max_bytes} bytes.", code="request_too_large")


def check_content_encoding(value: bytes | str | None) -> None:
    """A 415 for a body in an encoding the servers do not decode (gzip, br, ...): it was read as JSON and refused
    as "not valid JSON", which sent the client looking in the wrong place (and a plain body labelled br passed)."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if text is not None and text.strip().lower() not in ("", "identity"):
        message = f"Content-Encoding {text.strip()[:40]!r} is not supported: send the body unencoded."
        raise OpenAIError(415, message, code="unsupported_content_encoding")


def parse_json_object(raw: bytes, limits: RequestLimits) -> dict[str, Any]:
    """The body as a JSON object within `limits`, or a 400 that says which rule it broke."""
    if len(raw) > limits.max_body_bytes:
        raise body_too_large(limits.max_body_bytes)
    try:
        body = from_json(raw, allow_inf_nan=False, cache_strings="keys")
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise too_deep(limits.max_json_depth) from exc
        raise OpenAIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", code="invalid_json")
    if not within_by_counting(raw, limits):
        check_shape(body, limits)
    return body


def within_by_counting(raw: bytes, limits: RequestLimits) -> bool:
    """True when the raw text alone proves the shape within limits, so the walk is not needed: nesting needs
    an opening bracket per level and a list of n items n - 1 commas, and counting them (those inside strings
    too, which only errs towards walking) is C-speed. A chat turn passes here; a long conversation is walked."""
    openers = raw.count(b"{") + raw.count(b"[")
    return openers <= limits.max_json_depth and raw.count(b",") < limits.max_list_items


def too_deep(max_depth: int) -> OpenAIError:
    return OpenAIError(400, f"The request body is nested deeper than {max_depth} levels.", code="too_deeply_nested")


def check_shape(value: object, limits: RequestLimits) -> None:
    """Depth and list lengths of parsed JSON, without recursion: the first rule broken is a 400."""
    pending: list[tuple[object, int, str]] = [(value, 1, "")]
    while pending:
        item, depth, path = pending.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            if len(item) > limits.max_list_items:
                message = f"{path or 'body'}: at most {limits.max_list_items} items are allowed, got {len(item)}."
                raise OpenAIError(400, message, param=path or None, code="too_many_items")
            children = enumerate(item)
        else:
            continue
        if depth > limits.max_json_depth:
            raise too_deep(limits.max_json_depth)
        for key, child in children:
            if isinstance(child, dict | list):
                pending.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
