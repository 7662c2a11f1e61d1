"""API keys fail closed: a configured keys file without keys refuses everyone (at start and after a rotation
empties it), and so does one that stops parsing (until fixed; the gateway reports it not ready and in a
metric); malformed lines are reported by number only, and `#` is a comment only at a line's start. The key
is checked from the headers before the body is read. Key scopes and feature rate limits carry the
namespace: same-named features of two namespaces stay apart."""

from __future__ import annotations

import hashlib
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.access import KeyRing, parse_keys
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until

ALPHA, BRAVO = "sk-alpha-0123456789abcdef0123456789", "sk-bravo-0123456789abcdef0123456789"


def chat(gateway: Gateway, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def models(gateway: Gateway, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(gateway.url + "/v1/models", headers=headers, timeout=10)


def retrieve(gateway: Gateway, model: str, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{gateway.url}/v1/models/{model}", headers=headers, timeout=10)


def objects(upstreams: dict[str, Upstream]) -> list[dict[str, object]]:
    return [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]


def assert_refused_by_empty_keys(response: httpx.Response) -> None:
    assert response.status_code == 403
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "no_api_keys_configured")


@pytest.mark.parametrize("text", ["", "\n", "# keys are added later\n   # indented comment\n"])
def test_a_keys_file_without_keys_refuses_every_request_and_says_why_at_start(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    before = len(upstreams["v1"].state.bodies)
    with caplog.at_level(logging.ERROR, logger="servlane_gateway.app"):
        gateway = start_gateway(objects(upstreams), keys=text)
    assert any("holds no API key" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)
    for key in (None, ALPHA):
        assert_refused_by_empty_keys(chat(gateway, key))
        assert_refused_by_empty_keys(models(gateway, key))
    assert len(upstreams["v1"].state.bodies) == before


def test_without_a_keys_file_access_control_is_off(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    assert chat(start_gateway(objects(upstreams))).status_code == 200
    assert KeyRing().authenticate(None) is None


def test_a_rotation_that_empties_the_keys_refuses_everyone_and_logs_it(
    upstreams: dict[str, Upstream],
    start_gateway: StartGateway,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = start_gateway(objects(upstreams), keys=f"team-a: {ALPHA}\n")
    assert chat(gateway, ALPHA).status_code == 200
    keys_file = tmp_path / "keys"
    with caplog.at_level(logging.ERROR, logger="servlane_gateway.app"):
        replacement = keys_file.with_suffix(".new")
        replacement.write_text("# all keys revoked\n")
        replacement.replace(keys_file)  # a new inode, as a Secret update swaps the mounted file
        wait_until("the emptied keys file to apply", lambda: chat(gateway, ALPHA).status_code == 403, 10)
    assert_refused_by_empty_keys(chat(gateway, ALPHA))
    assert any("holds no API key" in r.getMessage() for r in caplog.records)

    replacement.write_text(f"team-b: {BRAVO}\n")
    replacement.replace(keys_file)
    wait_until("the new key to apply", lambda: chat(gateway, BRAVO).status_code == 200, 10)
    assert chat(gateway, ALPHA).status_code == 401


def keys_file_metrics(gateway: Gateway) -> tuple[float | None, float | None]:
    registry = gateway.state.metrics.registry
    valid = registry.get_sample_value("servlane_gateway_keys_file_valid")
    return valid, registry.get_sample_value("servlane_gateway_keys_file_loaded_timestamp_seconds")


def test_a_rotation_that_does_not_parse_refuses_everyone_until_fixed_and_logs_only_line_numbers(
    upstreams: dict[str, Upstream],
    start_gateway: StartGateway,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A revocation with a typo must not leave the revoked key valid: no key works until the file parses."""
    gateway = start_gateway(objects(upstreams), keys=f"team-a: {ALPHA}\nteam-b: {BRAVO}\n")
    assert httpx.get(gateway.url + "/ready", timeout=10).json() == {"status": "ready", "keys_file": "valid"}
    valid, loaded_at = keys_file_metrics(gateway)
    assert valid == 1
    assert loaded_at is not None
    keys_file = tmp_path / "keys"
    with caplog.at_level(logging.ERROR, logger="servlane_gateway.app"):
        replacement = keys_file.with_suffix(".new")
        replacement.write_text(f"team-a: {ALPHA}\nteam-b {BRAVO}\n")  # revoking nothing; a colon lost
        replacement.replace(keys_file)
        wait_until("the broken keys file to apply", lambda: chat(gateway, ALPHA).status_code == 403, 10)
    for key in (ALPHA, BRAVO, None):
        refused = chat(gateway, key)
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("permission_error", "api_keys_invalid")
        assert ALPHA not in refused.text
        assert models(gateway, key).status_code == 403
    assert any("line 2" in r.getMessage() for r in caplog.records)
    assert ALPHA not in caplog.text
    assert BRAVO not in caplog.text
    ready = httpx.get(gateway.url + "/ready", timeout=10)
    assert (ready.status_code, ready.json()["keys_file"]) == (503, "invalid")
    valid, reloaded_at = keys_file_metrics(gateway)
    assert valid == 0
    assert reloaded_at is not None
    assert reloaded_at >= loaded_at

    replacement.write_text(f"team-a: {ALPHA}\n")  # fixed (and team-b revoked)
    replacement.replace(keys_file)
    wait_until("the fixed keys file to apply", lambda: chat(gateway, ALPHA).status_code == 200, 10)
    assert chat(gateway, BRAVO).status_code == 401
    assert httpx.get(gateway.url + "/ready", timeout=10).status_code == 200
    assert keys_file_metrics(gateway)[0] == 1


def test_the_key_is_checked_before_the_body_is_read(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """A caller without a valid key gets its 401 without the gateway waiting for (or buffering) its body."""
    gateway = start_gateway(objects(upstreams), keys=f"team-a: {ALPHA}\n")
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    for authorization in (b"", b"authorization: Bearer sk-wrong\r\n"):
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            # Headers announcing a body that never comes.
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            conn.sendall(head + authorization + b"content-length: 100000\r\n\r\n")
            answer = conn.recv(4096)  # a timeout here: the gateway waited for the body
        assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
    # Too large a body with a bad key is the 401 too, not a 413 that answers before the key is checked.
    too_large = httpx.post(
        gateway.url + "/v1/chat/completions", content=b"x" * (gateway.state.limits.max_body_bytes + 1), timeout=10
    )
    assert too_large.status_code == 401


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"ok: {ALPHA}\nsk-secret-no-name\n", 2),
        (f"ok: {ALPHA}\n\n# c\nname-only-sk-secret:\n", 4),
        ("a: sk-secret-0123456789abcdef0123456789 chat embed\n", 1),
        ("a: sha256:abcdsecret\n", 1),
        (f"a: {ALPHA}\nb: {BRAVO}\na: sk-secret-0123456789abcdef0123456789\n", 3),
        ("a: sk-secret-0123456789abcdef0123456789 # a comment after the entry\n", 1),
        ("a: sk-secret-0123456789abcdef0123456789 #comment\n", 1),  # else the scope list ['#comment']
        (f"ok: {ALPHA}\nb: sk-secret-short\n", 2),
        (f"ok: {ALPHA}\nb: {BRAVO} chat\n", 2),  # a plain scope: see test_gateway_access
    ],
)
def test_malformed_lines_are_reported_by_number_never_by_content(text: str, line: int) -> None:
    with pytest.raises(ValueError, match=rf"^line {line}: ") as caught:
        parse_keys(text)
    assert "secret" not in str(caught.value)


def test_a_hash_inside_a_key_is_part_of_the_key() -> None:
    digest = hashlib.sha256(b"sk-ops#2").hexdigest()
    key = "sk-a#b#c-0123456789abcdef0123456789"
    keys = KeyRing(parse_keys(f"# comment\n  # indented comment\na: {key}\nops: sha256:{digest} prod/chat\n"))
    assert keys.authenticate(f"Bearer {key}").name == "a"  # type: ignore[union-attr]
    assert keys.authenticate("Bearer sk-ops#2").name == "ops"  # type: ignore[union-attr]
    with pytest.raises(OpenAIError) as caught:
        keys.authenticate("Bearer sk-a")  # the part before '#' is not a key
    assert caught.value.status == 401


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "namespace": namespace}}


def two_teams(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    """`chat` in team-a (the serving namespace, answered by v1) and in team-b (answered by v2)."""
    return [
        in_namespace(aimodel("m", upstreams["v1"].url), "team-a"),
        in_namespace(aimodel("m", upstreams["v2"].url), "team-b"),
        in_namespace(aifeature("chat", [("m", 100)]), "team-a"),
        in_namespace(aifeature("chat", [("m", 100)]), "team-b"),
    ]


def call(gateway: Gateway, model: str, key: str | None = None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code


def test_key_scopes_carry_the_namespace(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    exact, team_b = "sk-exact-0123456789abcdef0123456789", "sk-team-b-0123456789abcdef0123456789"
    keys = f"team-a: {ALPHA} team-a/chat\nexact: {exact} team-b/chat\nteam-b: {team_b} team-b/*\n"
    gateway = start_gateway(two_teams(upstreams), keys=keys, serving_namespaces=["team-a"])
    # Out of a key's scope is 404, as for a name that exists nowhere (no name leaks across namespaces).
    assert [call(gateway, m, ALPHA) for m in ("chat", "team-a/chat", "team-b/chat")] == [200, 200, 404]
    assert [call(gateway, m, exact) for m in ("chat", "team-a/chat", "team-b/chat")] == [200, 404, 200]
    assert [call(gateway, m, team_b) for m in ("chat", "team-b/chat", "team-b/m", "team-a/chat")] == [
        200,
        200,
        200,
        404,
    ]
    listed = {key: [e["id"] for e in models(gateway, key).json()["data"]] for key in (ALPHA, team_b)}
    assert listed == {ALPHA: ["chat"], team_b: ["chat", "m"]}  # each its own namespace's, by plain name
    # Retrieve (the openai SDK's models.retrieve) answers what the key may call, as its calls resolve.
    retrieved = {(key, m): retrieve(gateway, m, key) for key in (ALPHA, team_b) for m in ("chat", "team-b/chat", "m")}
    assert {k: r.status_code for k, r in retrieved.items()} == {
        (ALPHA, "chat"): 200,
        (ALPHA, "team-b/chat"): 404,  # as for a name that exists nowhere
        (ALPHA, "m"): 404,
        (team_b, "chat"): 200,
        (team_b, "team-b/chat"): 200,
        (team_b, "m"): 200,
    }
    assert retrieved[(team_b, "team-b/chat")].json()["id"] == "team-b/chat"
    assert retrieved[(ALPHA, "m")].json()["error"]["code"] == "model_not_found"
    assert retrieve(gateway, "chat", None).status_code == 401


def test_same_named_features_of_two_namespaces_do_not_share_a_rate_limit(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = start_gateway(two_teams(upstreams), serving_namespaces=["team-a"], feature_requests_per_minute=1)
    assert call(gateway, "chat") == 200
    assert call(gateway, "team-a/chat") == 429  # the same feature, by its full name: the same bucket
    assert call(gateway, "team-b/chat") == 200  # team B's chat has its own
    assert call(gateway, "team-b/chat") == 429
