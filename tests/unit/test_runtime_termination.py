"""The reason a failed runtime leaves in /health, its log and the pod's termination message."""

from __future__ import annotations

from pathlib import Path

from servlane_api.runtime_exit import MAX_TERMINATION_MESSAGE_CHARS
from servlane_operator.observed import ContainerExit
from servlane_runtime.termination import one_line, redact, secret_values, write_termination_message


def test_credential_variables_are_found_by_name_and_short_values_are_not_redacted() -> None:
    environ = {
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "DB_PASSWORD": "short",  # too short to redact without mangling ordinary words
        "HOME": "/home/someone-with-a-long-name",
    }
    assert secret_values(environ) == ["hf_abcdefghijklmnopqrstuvwx", "wJalrXUtnFEMI/K7MDENG"]


def test_redact_removes_secrets_url_passwords_and_tokens() -> None:
    text = (
        "download from https://user:pa55word@hub.example/models failed; key wJalrXUtnFEMI/K7MDENG; "
        "token hf_ABCDEFGHIJKLMNOPQRSTUV; header Authorization: Bearer eyJhbGciOi"
    )
    out = redact(text, ["wJalrXUtnFEMI/K7MDENG"])
    for secret in ("pa55word", "user:", "wJalrXUtnFEMI", "hf_ABCDEFGHIJKLMNOPQRSTUV", "eyJhbGciOi"):
        assert secret not in out
    assert "https://***@hub.example/models" in out
    assert redact("model path '/models/tiny' does not exist", []) == "model path '/models/tiny' does not exist"


def test_one_line_flattens_and_bounds_the_message() -> None:
    assert one_line("Traceback:\n  File x\n\tValueError:  bad") == "Traceback: File x ValueError: bad"
    long = one_line("x" * 5000)
    assert len(long) == MAX_TERMINATION_MESSAGE_CHARS
    assert long.endswith("…")


def test_the_termination_message_is_written_when_the_path_is_writable(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert write_termination_message("the engine died:\nEngineCore gone", str(path))
    assert path.read_text() == "the engine died: EngineCore gone\n"
    assert not write_termination_message("x", str(tmp_path / "no-such-dir" / "termination-log"))


def test_redact_cuts_a_presigned_urls_query_string_and_keeps_where_it_pointed() -> None:
    text = (
        "403 Forbidden. Cannot access content at: https://cdn.example/repos/ab/config.json?X-Amz-Algorithm=AWS4"
        "&X-Amz-Credential=AKIAFAKE0123%2Fus-east-1&X-Amz-Signature=deadbeef0123 (signed)"
    )
    out = redact(text, [])
    assert "AKIAFAKE0123" not in out
    assert "deadbeef0123" not in out
    assert "https://cdn.example/repos/ab/config.json (signed)" in out


def test_the_operator_redacts_a_termination_message_it_copies_into_status() -> None:
    """A log tail (FallbackToLogsOnError) has not been through the runtime's redaction."""
    tail = "Traceback ... GET https://u:pw@cdn.example/f?X-Amz-Signature=deadbeef0123 Authorization: Bearer abcdef"
    status = {"name": "runtime", "ready": False, "state": {"terminated": {"exitCode": 1, "message": tail}}}
    exit_ = ContainerExit.parse(status)
    assert exit_ is not None
    for secret in ("deadbeef0123", "pw@", "abcdef"):
        assert secret not in exit_.message
    assert "https://***@cdn.example/f" in exit_.message
