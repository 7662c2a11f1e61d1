"""Tool calling and structured outputs: what a chat request asks for, decided before any engine runs.

`plan_output(request)` checks the request's `tools`, `tool_choice` and `response_format` together (a
contradiction is a 400 in the one error shape) and says what the server must do:

- `tool_mode` "none": plain text, never tool calls (also when there are no tools);
- "auto": the model may call tools; its text is parsed for calls (the template's own format);
- "forced": the model must call (`required`, or one named function). Guided decoding with `json_schema`
  makes it write the calls as JSON, `{"name", "arguments"}` objects in an array, whatever the model, so
  even a tiny random model answers a valid call; `calls_from_forced_json` reads them back.
- `json_schema` alone (no forced tools): a `json_object`/`json_schema` response format, enforced the same way.

Pure: no engine, no HTTP.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from . import openai as p
from .errors import OpenAIError

ToolMode = Literal["none", "auto", "forced"]
# What `json_object` guarantees: some JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# A function without `parameters` takes no arguments: an empty object (OpenAI's reading).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class OutputPlan:
    tool_mode: ToolMode
    # The tools given to the chat template (none when tool_mode is "none"), as OpenAI sends them.
    tools: list[dict[str, Any]] | None
    # The JSON schema guided decoding enforces, as compact JSON text; None: unconstrained.
    json_schema: str | None
    # tool_choice named this function (forced): its calls finish with "stop", as OpenAI's and vLLM's do.
    named: str | None = None


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object as text


def bad_request(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_request")


def plan_output(req: p.ChatCompletionRequest) -> OutputPlan:
    """What `req` asks of the output, or a 400 naming the field that contradicts the others."""
    tools = req.tools or []
    choice = req.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise bad_request("tool_choice is only allowed when tools are given", "tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools must have different function names", "tools")
    named = choice.function.name if isinstance(choice, p.NamedToolChoice) else None
    if named is not None and named not in names:
        raise bad_request(f"tool_choice names the function '{named}', which is not in tools", "tool_choice")
    response_schema = _response_schema(req.response_format)
    if not tools or choice == "none":
        return OutputPlan("none", None, response_schema)
    wire_tools = [t.model_dump(mode="json", exclude_none=True) for t in tools]
    if choice is None or choice == "auto":
        return OutputPlan("auto", wire_tools, response_schema)
    if response_schema is not None:
        raise bad_request(
            "a forced tool_choice and a JSON response_format cannot both hold: the answer is tool calls",
            "response_format",
        )
    allowed = [t for t in tools if named is None or t.function.name == named]
    schema = calls_schema(allowed, one_call=named is not None or not req.parallel_tool_calls)
    return OutputPlan("forced", wire_tools, canonical(schema), named)


def _response_schema(fmt: p.ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return canonical(ANY_OBJECT)
    assert fmt.json_schema is not None  # ResponseFormat's own validation
    return canonical(fmt.json_schema.json_schema or ANY_OBJECT)


def calls_schema(tools: list[p.Tool], *, one_call: bool) -> dict[str, Any]:
    """A JSON array of 1 (or, with parallel calls, more) `{"name": <one of tools>, "arguments": <its schema>}`.

    A tool's parameters are a schema of their own: their `$ref`s point from their own root (`#/$defs/Inner`,
    as pydantic and the openai SDK write nested models, or `#` for a recursive one). Set inside this array they
    would point into it instead (`#/$defs/Inner` of the array: not found, a 400). Such parameters go to the
    array's `$defs` under a name of their own, their references re-pointed there."""
    defs: dict[str, Any] = {}
    variants = []
    for index, tool in enumerate(tools):
        parameters: Any = tool.function.parameters or NO_PARAMETERS
        if _has_local_ref(parameters):
            name = f"servlane_tool_{index}"
            defs[name] = _rooted(parameters, f"#/$defs/{name}")
            parameters = {"$ref": f"#/$defs/{name}"}
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool.function.name]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    item = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if one_call:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


# Keywords whose values are data, not schemas: a `$ref` key there is a value's, never re-pointed.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def _is_local_ref(key: str, value: Any) -> bool:
    return key == "$ref" and isinstance(value, str) and value.startswith("#")


def _has_local_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return any(_is_local_ref(k, v) or (k not in _DATA_KEYWORDS and _has_local_ref(v)) for k, v in schema.items())
    if isinstance(schema, list):
        return any(_has_local_ref(v) for v in schema)
    return False


def _rooted(schema: Any, root: str) -> Any:
    """`schema` with each local `$ref` (a JSON pointer from its own root: `#`, `#/...`) re-pointed under `root`."""
    if isinstance(schema, dict):
        return {
            k: root + v[1:] if _is_local_ref(k, v) else v if k in _DATA_KEYWORDS else _rooted(v, root)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_rooted(v, root) for v in schema]
    return schema


def calls_from_forced_json(text: str) -> list[ParsedToolCall]:
    """The calls in a forced answer (the array `calls_schema` describes); none when it is not one, which
    happens only when generation stopped early (max_tokens) and the JSON is incomplete."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    calls = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            calls.append(ParsedToolCall(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False)))
    return calls


_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(.*)\Z', re.DOTALL)


def calls_from_cut_forced_json(text: str) -> list[ParsedToolCall]:
    """The calls in a forced answer that max_tokens cut short: the whole ones, then the cut one with the
    arguments as far as they came (OpenAI's answer: tool calls, their arguments cut, finish_reason length),
    never the array the runtime asked guided decoding for, which is no part of the API."""
    at = text.find("[")
    if at < 0:
        return []
    decoder = json.JSONDecoder()
    calls: list[ParsedToolCall] = []
    at += 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            cut = _CUT_CALL.match(text, at)
            if cut is not None:
                calls.append(ParsedToolCall(cut.group(1), cut.group(2)))
            return calls
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            calls.append(ParsedToolCall(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False)))


def template_messages(messages: list[p.ChatMessage]) -> list[dict[str, Any]]:
    """The history as Hugging Face chat templates read it: tool calls with `arguments` as an object (the
    templates write it with `tojson`; OpenAI sends it as text), tool results with their `tool_call_id`."""
    out: list[dict[str, Any]] = []
    for m in messages:
        message: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _as_object(c)}}
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _as_object(call: p.ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments  # not JSON: the template gets the text as it came


def canonical(schema: dict[str, Any]) -> str:
    """Compact JSON text, keys in their order: guided decoding writes properties in the schema's order
    (a call's `name` before its `arguments`)."""
    return json.dumps(schema, separators=(",", ":"))
