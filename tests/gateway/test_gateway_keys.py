"""API keys fail closed: a configured keys file without keys refuses everyone (at start and after a rotation
empties it), malformed lines are reported by number only, and `#` is a comment only at a line's start.
Key scopes and feature rate limits carry the namespace: same-named features of two namespaces stay apart."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.access import KeyRing, parse_keys
from tests.gateway.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.polling import wait_until


def chat(gateway: Gateway, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def models(gateway: Gateway, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(gateway.url + "/v1/models", headers=headers, timeout=10)


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
    for key in (None, "sk-anything"):
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
    gateway = start_gateway(objects(upstreams), keys="team-a: sk-alpha\n")
    assert chat(gateway, "sk-alpha").status_code == 200
    keys_file = tmp_path / "keys"
    with caplog.at_level(logging.ERROR, logger="servlane_gateway.app"):
        replacement = keys_file.with_suffix(".new")
        replacement.write_text("# all keys revoked\n")
        replacement.replace(keys_file)  # a new inode, as a Secret update swaps the mounted file
        wait_until("the emptied keys file to apply", lambda: chat(gateway, "sk-alpha").status_code == 403, 10)
    assert_refused_by_empty_keys(chat(gateway, "sk-alpha"))
    assert any("holds no API key" in r.getMessage() for r in caplog.records)

    replacement.write_text("team-b: sk-bravo\n")
    replacement.replace(keys_file)
    wait_until("the new key to apply", lambda: chat(gateway, "sk-bravo").status_code == 200, 10)
    assert chat(gateway, "sk-alpha").status_code == 401


def test_a_malformed_rotation_keeps_the_previous_keys_and_logs_only_line_numbers(
    upstreams: dict[str, Upstream],
    start_gateway: StartGateway,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = start_gateway(objects(upstreams), keys="team-a: sk-alpha\n")
    keys_file = tmp_path / "keys"
    with caplog.at_level(logging.ERROR, logger="servlane_gateway.app"):
        replacement = keys_file.with_suffix(".new")
        replacement.write_text("team-a: sk-alpha\nsk-leaked-secret-without-a-name\n")
        replacement.replace(keys_file)
        wait_until("the reload to be refused", lambda: any("line 2" in r.getMessage() for r in caplog.records), 10)
    assert "sk-leaked" not in caplog.text
    assert chat(gateway, "sk-alpha").status_code == 200


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("ok: sk-1\nsk-secret-no-name\n", 2),
        ("ok: sk-1\n\n# c\nname-only-sk-secret:\n", 4),
        ("a: sk-secret-1 chat embed\n", 1),
        ("a: sha256:abcdsecret\n", 1),
        ("a: sk-1\nb: sk-2\na: sk-secret-3\n", 3),
        ("a: sk-secret-1 # a comment after the entry\n", 1),
        ("a: sk-secret-1 #comment\n", 1),  # would otherwise read as the feature list ['#comment']
    ],
)
def test_malformed_lines_are_reported_by_number_never_by_content(text: str, line: int) -> None:
    with pytest.raises(ValueError, match=rf"^line {line}: ") as caught:
        parse_keys(text)
    assert "secret" not in str(caught.value)


def test_a_hash_inside_a_key_is_part_of_the_key() -> None:
    digest = hashlib.sha256(b"sk-ops#2").hexdigest()
    keys = KeyRing(parse_keys(f"# comment\n  # indented comment\na: sk-a#b#c\nops: sha256:{digest} chat\n"))
    assert keys.authenticate("Bearer sk-a#b#c").name == "a"  # type: ignore[union-attr]
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
    keys = "plain: sk-plain chat\nexact: sk-exact team-b/chat\nteam-b: sk-team-b team-b/*\n"
    gateway = start_gateway(two_teams(upstreams), keys=keys, serving_namespaces=["team-a"])
    # Out of a key's scope is 404, as for a name that exists nowhere (no name leaks across namespaces).
    assert [call(gateway, m, "sk-plain") for m in ("chat", "team-a/chat", "team-b/chat")] == [200, 200, 404]
    assert [call(gateway, m, "sk-exact") for m in ("chat", "team-a/chat", "team-b/chat")] == [404, 404, 200]
    assert [call(gateway, m, "sk-team-b") for m in ("chat", "team-b/chat", "team-b/m")] == [404, 200, 200]
    listed = {key: [e["id"] for e in models(gateway, key).json()["data"]] for key in ("sk-plain", "sk-team-b")}
    assert listed == {"sk-plain": ["chat"], "sk-team-b": ["team-b/chat", "team-b/m"]}


def test_same_named_features_of_two_namespaces_do_not_share_a_rate_limit(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = start_gateway(two_teams(upstreams), serving_namespaces=["team-a"], feature_requests_per_minute=1)
    assert call(gateway, "chat") == 200
    assert call(gateway, "team-a/chat") == 429  # the same feature, by its full name: the same bucket
    assert call(gateway, "team-b/chat") == 200  # team B's chat has its own
    assert call(gateway, "team-b/chat") == 429
