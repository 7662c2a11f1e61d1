"""The Batch API's pure rules: parsing and validating the input lines, the shape of result lines, which
status follows which, and when a failed request is worth retrying. No I/O, no clock (callers pass `now`).

Shapes follow OpenAI's: an input line is `{"custom_id", "method": "POST", "url", "body"}`; an output line
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`; an error-file line
the same with `response` null and `error: {"code", "message"}` for a line that was never sent, or with the
backend's (or gateway's) non-2xx answer in `response`.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servlane_core.protocol.errors import OpenAIError
from servlane_core.protocol.limits import RequestLimits, parse_json_object

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"

VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
EXPIRED = "expired"
STATUSES = (VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, CANCELLING, CANCELLED, EXPIRED)
FINAL = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED})

# Which status may follow which. `finalizing` is passed through inside the one transaction that writes the
# result files (so it is never seen stuck); expiry and cancelling reach a final state through finalizing too.
TRANSITIONS: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({IN_PROGRESS, FAILED, CANCELLING, EXPIRED}),
    IN_PROGRESS: frozenset({FINALIZING, CANCELLING, EXPIRED}),
    FINALIZING: frozenset({COMPLETED, CANCELLED, EXPIRED}),
    CANCELLING: frozenset({FINALIZING, CANCELLED}),
    COMPLETED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
    EXPIRED: frozenset(),
}
# The timestamp field of the batch object that each status sets when reached.
STAMPS = {
    IN_PROGRESS: "in_progress_at",
    FINALIZING: "finalizing_at",
    COMPLETED: "completed_at",
    FAILED: "failed_at",
    CANCELLING: "cancelling_at",
    CANCELLED: "cancelled_at",
    EXPIRED: "expired_at",
}

# Gateway or backend answers that say "later" (quotas, overload, no ready backend): retried until the batch
# expires. Failures that may be transient: retried a few times. Anything else is the request's answer.
WAIT_STATUSES = frozenset({429, 503})
TRANSIENT_STATUSES = frozenset({500, 502, 504})
MAX_TRANSIENT_ATTEMPTS = 3
DEFAULT_LIMITS = RequestLimits()  # the gateway passes its own (--max-json-depth, ...)
MAX_CUSTOM_ID = 1024  # the column's width (schema.requests.custom_id)


class TransitionError(ValueError):
    pass


def can_move(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


def move(current: str, target: str) -> str:
    """`target` when it may follow `current`; TransitionError otherwise (e.g. cancelling a completed batch)."""
    if not can_move(current, target):
        raise TransitionError(f"a batch that is {current} cannot become {target}")
    return target


def final_status_of_finalizing(current: str, expired: bool) -> str:
    """The status a batch ends in once its results are written: cancelled when it was being cancelled,
    expired when its window passed first, else completed."""
    if current == CANCELLING:
        return CANCELLED
    return EXPIRED if expired else COMPLETED


def should_retry(status: int, attempts: int) -> bool:
    """Whether a request that got `status` on its `attempts`-th try goes back to the queue."""
    if status in WAIT_STATUSES:
        return True
    return status in TRANSIENT_STATUSES and attempts < MAX_TRANSIENT_ATTEMPTS


def fair_shares(room: int, in_flight: Mapping[str, int], waiting: Iterable[str]) -> dict[str, int]:
    """How many requests each owner with work waiting may claim now, out of `room` free places: one place at
    a time to the owner with the fewest in flight (ties: in `waiting`'s order, oldest work first), so one
    owner's huge batch never makes another owner's small one wait for it to end."""
    order = list(dict.fromkeys(waiting))
    heap = [(in_flight.get(owner, 0), rank, owner) for rank, owner in enumerate(order)]
    heapq.heapify(heap)
    shares = dict.fromkeys(order, 0)
    for _ in range(room if heap else 0):
        count, rank, owner = heapq.heappop(heap)
        shares[owner] += 1
        heapq.heappush(heap, (count + 1, rank, owner))
    return shares


@dataclass(frozen=True)
class LineError:
    line: int  # 1-based, as OpenAI reports it
    code: str
    message: str
    custom_id: str | None = None
    param: str | None = None


@dataclass(frozen=True)
class RequestLine:
    line: int
    custom_id: str
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body["model"])


@dataclass
class Validated:
    requests: list[RequestLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    fatal: LineError | None = None  # the whole file is unusable: the batch fails

    @property
    def total(self) -> int:
        return len(self.requests) + len(self.errors)


def parse_line(
    text: str, number: int, endpoint: str, limits: RequestLimits = DEFAULT_LIMITS
) -> RequestLine | LineError:
    """One input line, checked the way OpenAI checks it (minus the model, see `validate`). It is parsed by
    the parser and within the limits of an interactive request body (size, depth, list lengths): a line
    nested 100,000 deep is this line's error, never a RecursionError that stops the batch's validation."""
    try:
        obj = parse_json_object(text.encode(), line_limits(limits))
    except OpenAIError as exc:  # too large, too deep, too long a list, not JSON, not an object
        if exc.code == "invalid_json":
            not_object = "must be a JSON object" in exc.message
            message = "This line is not a JSON object." if not_object else "This line is not parseable as valid JSON."
            return LineError(number, "invalid_json_line", message)
        message = exc.message.replace("Request body", "The line").replace("request body", "line")
        return LineError(number, exc.code or "invalid_request", message, param=exc.param)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(number, "missing_required_parameter", "Missing custom_id.", param="custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        message = f"The custom_id is longer than {MAX_CUSTOM_ID} characters."
        return LineError(number, "invalid_request", message, param="custom_id")
    if "\x00" in custom_id:  # PostgreSQL stores no NUL in text: the whole batch's validation failed on it
        return LineError(number, "invalid_request", "The custom_id holds a NUL character.", param="custom_id")
    if obj.get("method") != "POST":
        message = "The method must be POST."
        return LineError(number, "invalid_request", message, custom_id=custom_id, param="method")
    if obj.get("url") != endpoint:
        message = f"The url {obj.get('url')!r} does not match the batch's endpoint {endpoint!r}."
        return LineError(number, "invalid_url", message, custom_id=custom_id, param="url")
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineError(number, "invalid_request", "The body must be a JSON object.", custom_id=custom_id)
    if not isinstance(body.get("model"), str) or not body["model"]:
        return LineError(number, "missing_required_parameter", "Missing model.", custom_id=custom_id, param="model")
    stream = body.get("stream")
    if stream is not None and stream is not False:  # `1` or "yes" ran as a stream (its raw text the output)
        message = "Streaming is not supported in a batch." if stream is True else "stream must be a boolean."
        return LineError(number, "invalid_request", message, custom_id=custom_id, param="body.stream")
    return RequestLine(number, custom_id, body)


def line_limits(limits: RequestLimits) -> RequestLimits:
    """A line holds a request body inside its envelope (custom_id, method, url, body): one level deeper."""
    return limits.model_copy(update={"max_json_depth": limits.max_json_depth + 1})


def validate(
    content: bytes | Iterable[bytes],
    endpoint: str,
    callable_model: Callable[[str], bool],
    limits: RequestLimits = DEFAULT_LIMITS,
) -> Validated:
    """All lines of an input file (whole, or its chunks as they are read: never joined). Bad lines become
    errors of their own; the batch fails only when the file is not UTF-8 text, holds no line, or not a single
    line is usable. `callable_model` says whether the batch's owner may call a model (the same answer a
    request would get: unknown and forbidden look alike)."""
    result = Validated()
    try:
        _validate_lines(result, text_lines(content), endpoint, callable_model, limits)
    except UnicodeDecodeError:
        return Validated(fatal=LineError(0, "invalid_file", "The input file is not UTF-8 encoded JSONL."))
    return result


def text_lines(content: bytes | Iterable[bytes]) -> Iterator[str]:
    """The JSONL lines of UTF-8 text given in chunks: ended by LF, a CR before it dropped (jsonlines.org), a line
    break possibly falling across chunks (no UTF-8 character holds the byte of a newline). Not str.splitlines():
    it also breaks at U+2028, U+0085 and the like, which a JSON string may hold unescaped, and so cut a valid
    request in two. UnicodeDecodeError on the first bad line."""
    parts: list[bytes] = []  # of the line not yet ended: joined once it ends, not copied chunk after chunk
    first = True
    for chunk in [content] if isinstance(content, bytes | bytearray) else content:
        data = bytes(chunk)
        if first and data:
            first = False
            data = data.removeprefix(b"\xef\xbb\xbf")  # a byte order mark (Windows editors) is no part of line 1
        *ended, rest = data.split(b"\n")
        if ended:
            ended[0] = b"".join([*parts, ended[0]])
            parts = []
        for raw in ended:
            yield _line(raw)
        parts.append(rest)
    last = b"".join(parts)
    if last:
        yield _line(last)


def _line(raw: bytes) -> str:
    return (raw[:-1] if raw.endswith(b"\r") else raw).decode("utf-8")


def _validate_lines(
    result: Validated,
    lines: Iterable[str],
    endpoint: str,
    callable_model: Callable[[str], bool],
    limits: RequestLimits,
) -> None:
    seen: set[str] = set()
    number = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        parsed = parse_line(raw, number, endpoint, limits)
        if isinstance(parsed, RequestLine):
            if parsed.custom_id in seen:
                message = f"The custom_id {parsed.custom_id!r} appears on an earlier line; each must be unique."
                parsed = LineError(number, "duplicate_custom_id", message, custom_id=parsed.custom_id)
            elif not callable_model(parsed.model):
                message = f"The model '{parsed.model}' does not exist or you do not have access to it."
                parsed = LineError(number, "model_not_found", message, custom_id=parsed.custom_id, param="model")
            else:
                seen.add(parsed.custom_id)
        if isinstance(parsed, LineError):
            result.errors.append(parsed)
        else:
            result.requests.append(parsed)
    if not result.requests:
        reason = "holds no request line" if not result.errors else "holds no valid request line"
        result.fatal = LineError(max(number, 0), "invalid_file", f"The input file {reason}.")


def input_deleted() -> LineError:
    """The batch's error when its input file was deleted before it was read whole."""
    return LineError(0, "invalid_file", "The input file was deleted while the batch was being validated.")


def unvalidatable(reason: str) -> LineError:
    """The batch's error when its file could not be validated at all (the gateway's limits, not a line)."""
    return LineError(0, "invalid_file", f"The input file could not be validated ({reason}).")


def error_line(error: LineError, request_id: str) -> dict[str, Any]:
    """An error-file line for a request line that was never sent."""
    return _unanswered_line(request_id, error.custom_id, error.code, f"Line {error.line}: {error.message}")


def _unanswered_line(request_id: str, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """An error-file line for a request that got no answer (never sent, or its answer not kept)."""
    return {"id": request_id, "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}


def response_line(request_id: str, custom_id: str, status: int, request_ref: str, body: object) -> dict[str, Any]:
    """An output (2xx) or error-file (otherwise) line for a request that got an answer."""
    return {
        "id": request_id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_ref, "body": body},
        "error": None,
    }


def expired_line(request_id: str, custom_id: str) -> dict[str, Any]:
    message = "This request could not be executed before the completion window expired."
    return _unanswered_line(request_id, custom_id, "batch_expired", message)


QUOTA_EXCEEDED = "storage_quota_exceeded"


def quota_message(used: int, size: int, quota: int) -> str:
    """Why a batch ended early: an answer that would take its owner past its quota (files.QuotaExceeded)."""
    return (
        f"An answer of {size} bytes would take this API key's stored files and unfinished batches past its quota "
        f"({quota} bytes, {used} in use), so the batch was cancelled; delete files to make room."
    )


def quota_line(request_id: str, custom_id: str, message: str) -> dict[str, Any]:
    """The error-file line of a request whose answer was not kept for its owner's quota."""
    return _unanswered_line(request_id, custom_id, QUOTA_EXCEEDED, message)


def quota_errors(message: str) -> dict[str, Any]:
    """The batch object's `errors` when it was cancelled for its owner's quota (no line of its own: line 0)."""
    return batch_errors(LineError(0, QUOTA_EXCEEDED, message))


def json_line(line: dict[str, Any]) -> str:
    """A result line as stored and as written to the output and error files (compact, no newline)."""
    return json.dumps(line, separators=(",", ":"))


def jsonl(lines: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json_line(line).encode() + b"\n" for line in lines)


# At most this many of the lines' own errors in a failed batch's `errors` (each line's is in no error file then).
MAX_BATCH_ERRORS = 100


def batch_errors(fatal: LineError, lines: Sequence[LineError] = ()) -> dict[str, Any]:
    """The batch object's `errors` when validation failed: why, then the first lines' own errors (OpenAI lists
    them there; with every line invalid there is no error file, and they were lost)."""
    data = [
        {"code": e.code, "message": e.message, "param": e.param, "line": e.line or None}
        for e in [fatal, *lines[:MAX_BATCH_ERRORS]]
    ]
    return {"object": "list", "data": data}
