"""API keys, authorisation, token buckets, rate limits, feature defaults and settings (pure parts)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from servlane_api.aifeature import FeatureDefaults
from servlane_core.protocol.errors import OpenAIError
from servlane_core.routing.defaults import apply_defaults
from servlane_gateway.access import KeyRing, authorize, parse_keys
from servlane_gateway.ratelimit import Limits, RateLimiter, TokenBucket
from servlane_gateway.settings import parse_settings

KEYS = """
# team keys
team-a: sk-alpha
team-b: sk-bravo chat,embed
ops: sha256:{digest}
"""


class Clock:
    """A clock the test moves by hand, so bucket refills are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ring() -> KeyRing:
    return KeyRing(parse_keys(KEYS.format(digest=hashlib.sha256(b"sk-ops").hexdigest())))


def test_keys_are_held_as_hashes_and_found_by_the_bearer_token() -> None:
    keys = ring()
    assert keys.enabled
    assert all(b"sk-" not in k.digest and len(k.digest) == 32 for k in keys.keys)
    assert keys.authenticate("Bearer sk-alpha").name == "team-a"  # type: ignore[union-attr]
    assert keys.authenticate("bearer sk-ops").name == "ops"  # type: ignore[union-attr]
    assert keys.find("sk-nope") is None


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-alpha", "Bearer sk-wrong"])
def test_missing_or_bad_keys_are_401_without_the_key_in_the_message(header: str | None) -> None:
    with pytest.raises(OpenAIError) as caught:
        ring().authenticate(header)
    assert caught.value.status == 401
    assert "sk-wrong" not in caught.value.message


def test_keys_limited_to_features_get_403_elsewhere() -> None:
    keys = ring()
    team_b = keys.authenticate("Bearer sk-bravo")
    authorize(team_b, "chat")
    with pytest.raises(OpenAIError) as caught:
        authorize(team_b, "summarise")
    assert caught.value.status == 403
    assert caught.value.body()["error"]["param"] == "model"
    authorize(keys.authenticate("Bearer sk-alpha"), "summarise")


def test_no_keys_file_means_access_control_off_but_a_file_without_keys_refuses_everyone() -> None:
    assert KeyRing().authenticate(None) is None
    empty = KeyRing(parse_keys("# none yet\n"))
    for header in (None, "Bearer sk-alpha"):
        with pytest.raises(OpenAIError) as caught:
            empty.authenticate(header)
        assert caught.value.status == 403


@pytest.mark.parametrize("text", ["just-a-key", "name:", "a: k1\na: k2", "x: sha256:abcd", "x: k f1 f2"])
def test_malformed_key_files_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        parse_keys(text)


def test_token_bucket_refills_at_its_rate_up_to_one_minute() -> None:
    clock = Clock()
    bucket = TokenBucket(60, clock)  # one per second, burst 60
    for _ in range(60):
        assert bucket.wait_for(1) == 0
        bucket.take(1)
    assert bucket.wait_for(1) == pytest.approx(1.0)
    clock.now += 0.5
    assert bucket.wait_for(1) == pytest.approx(0.5)
    clock.now += 1000
    assert bucket.level == 0.5
    assert bucket.wait_for(60) == 0
    assert bucket.level == 60


def test_rate_limiter_answers_429_with_retry_after_and_takes_all_or_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(per_key=Limits(requests_per_minute=2), per_feature=Limits(requests_per_minute=3), clock=clock)
    limiter.admit("a", "chat")
    limiter.admit("a", "chat")
    with pytest.raises(OpenAIError) as caught:
        limiter.admit("a", "chat")
    assert caught.value.status == 429
    assert caught.value.headers()["Retry-After"] == "30"
    limiter.admit("b", "chat")  # the feature's third request
    with pytest.raises(OpenAIError):
        limiter.admit("c", "chat")  # the feature is out: key c must not have paid
    clock.now += 20  # one feature request refilled
    limiter.admit("c", "chat")


def test_token_limit_charges_usage_after_the_fact() -> None:
    clock = Clock()
    limiter = RateLimiter(per_key=Limits(tokens_per_minute=600), clock=clock)
    limiter.admit("a", "chat")
    limiter.charge_tokens("a", "chat", 900)  # into debt by 300 tokens
    with pytest.raises(OpenAIError) as caught:
        limiter.admit("a", "chat")
    assert caught.value.headers()["Retry-After"] == "31"  # 301 tokens at 10 per second
    clock.now += 31
    limiter.admit("a", "chat")


def test_feature_defaults_fill_gaps_and_cap_max_tokens() -> None:
    defaults = FeatureDefaults(system_prompt="Be brief.", temperature=0.2, top_p=0.9, max_tokens_cap=64)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500, "temperature": 1.0}
    apply_defaults(body, defaults, "chat/completions")
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 0.9, 64)
    own: dict[str, Any] = {"messages": [{"role": "system", "content": "Mine."}]}
    apply_defaults(own, defaults, "chat/completions")
    assert len(own["messages"]) == 1
    assert own["max_tokens"] == 64
    embed: dict[str, Any] = {"input": "x"}
    apply_defaults(embed, defaults, "embeddings")
    assert embed == {"input": "x"}


def test_settings_from_cli_over_environment(tmp_path: Path) -> None:
    env = {"SERVLANE_GATEWAY_PORT": "9000", "SERVLANE_GATEWAY_NAMESPACES": "a, b", "SERVLANE_GATEWAY_WATCH": "1"}
    settings = parse_settings(["--port", "9100", "--idle-timeout", "7"], env)
    assert (settings.port, settings.namespaces, settings.watch, settings.idle_timeout) == (9100, ["a", "b"], True, 7)
    with pytest.raises(ValueError, match="exactly one"):
        parse_settings(["--routes-file", str(tmp_path / "r.yaml")], env)
