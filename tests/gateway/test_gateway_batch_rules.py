"""The Batch API's pure rules: which input lines are requests and which become error-file lines (in
OpenAI's shape), when the whole file fails the batch, which status may follow which, what is retried."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servlane_core.protocol.limits import RequestLimits
from servlane_gateway.batch import rules

CHAT = "/v1/chat/completions"


def line(custom_id: str | None = "r1", url: str = CHAT, model: str = "chat", **extra: Any) -> str:
    obj: dict[str, Any] = {"method": "POST", "url": url, "body": {"model": model, "messages": []}} | extra
    if custom_id is not None:
        obj["custom_id"] = custom_id
    return json.dumps(obj)


def raw(body: object) -> str:
    return json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": body})


def everything(_model: str) -> bool:
    return True


def test_a_good_line_is_a_request_with_its_line_number_and_body() -> None:
    parsed = rules.parse_line(line("a"), 7, CHAT)
    assert parsed == rules.RequestLine(7, "a", {"model": "chat", "messages": []})


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [
        ("{not json", "invalid_json_line", None),
        ("[1, 2]", "invalid_json_line", None),
        (line(None), "missing_required_parameter", "custom_id"),
        (line(""), "missing_required_parameter", "custom_id"),
        (line(url="/v1/embeddings"), "invalid_url", "url"),
        (line(method="GET"), "invalid_request", "method"),
        (raw({"messages": []}), "missing_required_parameter", "model"),
        (raw("hi"), "invalid_request", None),
        (raw({"model": "m", "stream": True}), "invalid_request", "body.stream"),
        (raw({"model": "m", "stream": 1}), "invalid_request", "body.stream"),  # ran as a stream before
        (raw({"model": "m", "stream": "yes"}), "invalid_request", "body.stream"),
        (line("a\u0000b"), "invalid_request", "custom_id"),  # PostgreSQL failed the whole batch on it
    ],
)  # fmt: skip
def test_bad_lines_are_errors_naming_why(text: str, code: str, param: str | None) -> None:
    parsed = rules.parse_line(text, 3, CHAT)
    assert isinstance(parsed, rules.LineError)
    assert (parsed.line, parsed.code, parsed.param) == (3, code, param)


def test_bad_lines_go_to_the_error_file_and_the_rest_still_run() -> None:
    content = "\n".join(
        [line("a"), "garbage", line("b", url="/v1/completions"), line("a"), line("c", model="secret"), "", line("d")]
    ).encode()
    validated = rules.validate(content, CHAT, lambda model: model != "secret")
    assert [r.custom_id for r in validated.requests] == ["a", "d"]
    assert [(e.line, e.code) for e in validated.errors] == [
        (2, "invalid_json_line"),
        (3, "invalid_url"),
        (4, "duplicate_custom_id"),
        (5, "model_not_found"),
    ]
    assert validated.fatal is None
    assert validated.total == 6  # the blank line is no request


def test_an_error_file_line_has_openais_shape() -> None:
    error = rules.LineError(4, "duplicate_custom_id", "again", custom_id="a")
    assert rules.error_line(error, "batch_req_1") == {
        "id": "batch_req_1",
        "custom_id": "a",
        "response": None,
        "error": {"code": "duplicate_custom_id", "message": "Line 4: again"},
    }
    answered = rules.response_line("batch_req_2", "b", 200, "req", {"ok": 1})
    assert answered["response"] == {"status_code": 200, "request_id": "req", "body": {"ok": 1}}
    assert answered["error"] is None
    assert rules.jsonl([answered, answered]).count(b"\n") == 2


@pytest.mark.parametrize(
    "content", [b"", b"\n\n", b"garbage\n{}\n", b"\xff\xfe not utf-8", line("a", url="/v1/embeddings").encode()]
)
def test_a_file_without_a_single_usable_line_fails_the_batch(content: bytes) -> None:
    validated = rules.validate(content, CHAT, everything)
    assert validated.fatal is not None
    assert validated.fatal.code == "invalid_file"
    errors = rules.batch_errors(validated.fatal, validated.errors)
    assert errors["object"] == "list"
    assert errors["data"][0]["code"] == "invalid_file"
    # Each line's own reason follows (no error file is written for a failed batch): it was lost.
    assert [e["line"] for e in errors["data"][1:]] == [e.line for e in validated.errors]


def test_a_failed_batch_lists_its_first_lines_errors_only() -> None:
    content = "\n".join(line(None) for _ in range(250)).encode()
    validated = rules.validate(content, CHAT, everything)
    assert validated.fatal is not None
    data = rules.batch_errors(validated.fatal, validated.errors)["data"]
    assert len(data) == 1 + rules.MAX_BATCH_ERRORS
    assert data[1] == {
        "code": "missing_required_parameter",
        "message": "Missing custom_id.",
        "param": "custom_id",
        "line": 1,
    }


def test_a_byte_order_mark_is_no_part_of_the_first_line() -> None:
    validated = rules.validate(b"\xef\xbb\xbf" + line("a").encode() + b"\n" + line("b").encode(), CHAT, everything)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]


def test_a_file_whose_models_are_all_uncallable_fails_too() -> None:
    assert rules.validate(line("a").encode(), CHAT, lambda _m: False).fatal is not None


@pytest.mark.parametrize(
    ("current", "target", "allowed"),
    [
        (rules.VALIDATING, rules.IN_PROGRESS, True),
        (rules.VALIDATING, rules.FAILED, True),
        (rules.IN_PROGRESS, rules.CANCELLING, True),
        (rules.VALIDATING, rules.CANCELLING, True),
        (rules.CANCELLING, rules.CANCELLED, True),
        (rules.IN_PROGRESS, rules.FINALIZING, True),
        (rules.FINALIZING, rules.COMPLETED, True),
        (rules.IN_PROGRESS, rules.COMPLETED, False),  # only through finalizing
        (rules.COMPLETED, rules.CANCELLING, False),
        (rules.FAILED, rules.IN_PROGRESS, False),
        (rules.CANCELLED, rules.CANCELLING, False),
        (rules.EXPIRED, rules.COMPLETED, False),
    ],
)
def test_state_transitions(current: str, target: str, allowed: bool) -> None:
    assert rules.can_move(current, target) is allowed
    if allowed:
        assert rules.move(current, target) == target
    else:
        with pytest.raises(rules.TransitionError, match=f"{current} cannot become {target}"):
            rules.move(current, target)


def test_final_states_have_no_way_out_and_every_status_is_known() -> None:
    assert set(rules.TRANSITIONS) == set(rules.STATUSES)
    for status in rules.FINAL:
        assert not rules.TRANSITIONS[status]


def test_the_status_a_finished_batch_ends_in() -> None:
    assert rules.final_status_of_finalizing(rules.IN_PROGRESS, expired=False) == rules.COMPLETED
    assert rules.final_status_of_finalizing(rules.IN_PROGRESS, expired=True) == rules.EXPIRED
    assert rules.final_status_of_finalizing(rules.CANCELLING, expired=True) == rules.CANCELLED


def test_quotas_and_overload_are_waited_out_transient_failures_retried_a_few_times_the_rest_recorded() -> None:
    assert rules.should_retry(429, 50)
    assert rules.should_retry(503, 50)
    assert rules.should_retry(502, 1)
    assert rules.should_retry(504, 2)
    assert not rules.should_retry(502, rules.MAX_TRANSIENT_ATTEMPTS)
    assert not rules.should_retry(400, 1)
    assert not rules.should_retry(404, 1)
    assert not rules.should_retry(200, 1)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (nested(100_000), "too_deeply_nested"),  # json.loads raised RecursionError, past the error handling
        (nested(30), "too_deeply_nested"),  # deeper than an interactive request may be
        ({"model": "chat", "input": list(range(20))}, "too_many_items"),
    ],
)
def test_a_line_is_held_to_the_limits_of_an_interactive_request_and_is_its_own_error(body: object, code: str) -> None:
    text = raw("BODY").replace('"BODY"', body) if isinstance(body, str) else raw(body)
    limits = RequestLimits(max_json_depth=20, max_list_items=10)
    content = "\n".join([line("a"), text, line("b")]).encode()
    validated = rules.validate(content, CHAT, everything, limits)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]
    [error] = validated.errors
    assert (error.line, error.code) == (2, code)
    assert validated.fatal is None


def test_a_line_longer_than_the_body_limit_is_its_own_error() -> None:
    limits = RequestLimits(max_body_bytes=200)
    validated = rules.validate(
        f"{raw({'model': 'chat', 'x': 'y' * 300})}\n{line('a')}".encode(), CHAT, everything, limits
    )
    assert [(e.line, e.code) for e in validated.errors] == [(1, "request_too_large")]
    assert [r.custom_id for r in validated.requests] == ["a"]


def test_the_interactive_depth_limit_counts_the_body_not_the_lines_envelope() -> None:
    limits = RequestLimits(max_json_depth=3)
    ok = {"model": "chat", "messages": [{"role": "user"}]}  # body, messages, message: 3 levels
    assert isinstance(rules.parse_line(raw(ok), 1, CHAT, limits), rules.RequestLine)
    too_deep = {"model": "chat", "messages": [{"role": ["user"]}]}
    assert isinstance(rules.parse_line(raw(too_deep), 1, CHAT, limits), rules.LineError)


def test_a_custom_id_longer_than_its_column_is_a_line_error() -> None:
    parsed = rules.parse_line(line("x" * (rules.MAX_CUSTOM_ID + 1)), 4, CHAT)
    assert isinstance(parsed, rules.LineError)
    assert (parsed.code, parsed.param) == ("invalid_request", "custom_id")


def test_free_places_go_to_the_owners_with_the_fewest_in_flight_first() -> None:
    # A holds 8 in flight; B just arrived: the one free place is B's, then they alternate.
    assert rules.fair_shares(1, {"a": 8}, ["a", "b"]) == {"a": 0, "b": 1}
    assert rules.fair_shares(10, {"a": 8}, ["a", "b"]) == {"a": 1, "b": 9}
    assert rules.fair_shares(4, {}, ["a", "b", "a"]) == {"a": 2, "b": 2}
    assert rules.fair_shares(3, {}, ["b", "a"]) == {"b": 2, "a": 1}  # ties: the oldest work first
    assert rules.fair_shares(5, {"a": 1}, []) == {}


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("a\nb\n", ["a", "b"]),
        ("a\n\n\nb", ["a", "", "", "b"]),
        ("a\r\nb\rc\r\n\r\n", ["a", "b\rc", ""]),
        ("é\u2028ü\n\x0bend\x85", ["é\u2028ü", "\x0bend\x85"]),
        ("\n", [""]),
        ("", []),
        ("no newline at all", ["no newline at all"]),
        ("trailing\r", ["trailing"]),
    ],
)
def test_lines_read_from_chunks_are_the_jsonl_lines_of_the_whole_text(text: str, lines: list[str]) -> None:
    """However a file is cut into chunks (even inside a UTF-8 character or a \\r\\n), its lines are those
    JSONL has: ended by LF, a CR before it dropped; no other character ends a line."""
    data = text.encode()
    for size in range(1, len(data) + 2):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert list(rules.text_lines(iter(chunks))) == lines, size


def test_a_request_whose_text_holds_a_unicode_line_separator_is_one_request() -> None:
    """JSON lets a string hold U+2028, U+2029 and U+0085 unescaped (json.dumps(ensure_ascii=False) writes them
    so): the line is one request, not two broken halves."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "one\u2028two\u2029three\x85four"}]}
    request = {"custom_id": "sep", "method": "POST", "url": CHAT, "body": body}
    content = (json.dumps(request, ensure_ascii=False) + "\n" + line("b")).encode()
    result = rules.validate(content, CHAT, everything)
    assert result.errors == []
    assert [r.custom_id for r in result.requests] == ["sep", "b"]


def test_a_file_validated_from_its_chunks_is_validated_as_the_whole_file() -> None:
    content = "\n".join([line("a"), "not json", line("b"), "", line("a")]).encode()
    whole = rules.validate(content, CHAT, everything)
    chunked = rules.validate(iter([content[i : i + 7] for i in range(0, len(content), 7)]), CHAT, everything)
    assert chunked == whole
    assert [r.custom_id for r in chunked.requests] == ["a", "b"]
    assert [e.line for e in chunked.errors] == [2, 5]


def test_a_bad_utf8_byte_in_a_later_chunk_fails_the_file_with_nothing_else() -> None:
    validated = rules.validate(iter([line("a").encode() + b"\n", b"\xff\n"]), CHAT, everything)
    assert validated.fatal is not None
    assert validated.fatal.code == "invalid_file"
    assert validated.requests == []
    assert validated.errors == []
