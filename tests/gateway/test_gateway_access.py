"""API keys, authorisation, token buckets, rate limits, feature defaults and settings (pure parts)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from servlane_api.aifeature import FeatureDefaults
from servlane_core.protocol.errors import OpenAIError
from servlane_core.routing.defaults import apply_defaults
from servlane_core.routing.routes import RouteTable, build_route_table
from servlane_gateway.access import ApiKey, KeyRing, authorize, parse_keys
from servlane_gateway.ratelimit import Limits, RateLimiter, TokenBucket
from servlane_gateway.settings import parse_settings
from servlane_gateway.sources import parse_objects
from tests.gateway.gateway_harness import aifeature

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


def feature(name: str, namespace: str) -> dict[str, Any]:
    return aifeature(name, [("m", 100)], namespace=namespace)


def routes(serving: tuple[str, ...] = ("prod", "staging")) -> RouteTable:
    """`chat` in prod, staging and team-b; `summarise` in prod; `search` only in team-b (not serving)."""
    objects = [feature("chat", ns) for ns in ("prod", "staging", "team-b")]
    objects += [feature("summarise", "prod"), feature("search", "team-b")]
    return build_route_table(*parse_objects(objects), serving)


def may_call(key: ApiKey | None, name: str, table: RouteTable | None = None) -> bool:
    """Whether `key` may call what a request for `name` resolves to."""
    table = table or routes()
    route = table.lookup(name)
    assert route is not None, name
    refusal: OpenAIError | None = None
    try:
        authorize(key, route, table, name)
    except OpenAIError as refused:
        refusal = refused
    if refusal is None:
        return True
    # Out of scope reads as missing: a refusal must not tell which names exist elsewhere.
    assert (refusal.status, refusal.body()["error"]["code"]) == (404, "model_not_found")
    return False


def scoped(scopes: str) -> ApiKey:
    key = parse_keys(f"k: sk-k {scopes}")[0]
    assert key.scopes is not None
    return key


def test_keys_limited_to_features_get_404_elsewhere() -> None:
    keys = ring()
    team_b = keys.authenticate("Bearer sk-bravo")
    assert may_call(team_b, "chat")
    assert not may_call(team_b, "summarise")
    assert may_call(keys.authenticate("Bearer sk-alpha"), "summarise")
    assert may_call(None, "team-b/search")  # access control off


def test_a_plain_scope_reaches_only_what_a_request_for_that_name_gets() -> None:
    key = scoped("chat")
    assert may_call(key, "chat")
    assert may_call(key, "prod/chat")  # the same object, by its full name
    # Not the same name elsewhere: another team's, nor a serving namespace later in the search path.
    assert not may_call(key, "team-b/chat")
    assert not may_call(key, "staging/chat")
    # The scope follows the search path, exactly as requests do.
    assert may_call(key, "staging/chat", routes(serving=("staging", "prod")))
    assert not may_call(key, "prod/chat", routes(serving=("staging", "prod")))


def test_a_namespaced_scope_is_exactly_that_object_and_ns_star_the_whole_namespace() -> None:
    exact = scoped("team-b/chat")
    assert may_call(exact, "team-b/chat")
    assert not may_call(exact, "chat")  # prod's
    assert not may_call(exact, "team-b/search")
    team_b = scoped("team-b/*")
    assert may_call(team_b, "team-b/chat")
    assert may_call(team_b, "team-b/search")
    assert not may_call(team_b, "chat")
    assert not may_call(team_b, "summarise")
    both = scoped("summarise,team-b/*")
    assert [may_call(both, n) for n in ("summarise", "team-b/search", "chat")] == [True, True, False]


def test_existing_key_files_keep_their_meaning() -> None:
    """Plain entries parse as before; a key without a list may call everything."""
    key = parse_keys("team-b: sk-bravo chat,embed")[0]
    assert key.scopes is not None
    assert {(s.namespace, s.name) for s in key.scopes} == {(None, "chat"), (None, "embed")}
    assert parse_keys("team-a: sk-alpha")[0].scopes is None


@pytest.mark.parametrize("scopes", ["*", "/chat", "prod/", "a/b/c", "Prod/*", "prod_x/chat", "chat,/x"])
def test_malformed_scopes_are_refused_by_line_number(scopes: str) -> None:
    with pytest.raises(ValueError, match="line 2: a scope is") as caught:
        parse_keys(f"# keys\nk: sk-secret {scopes}")
    assert "sk-secret" not in str(caught.value)


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
    limiter.admit("a", "prod", "chat")
    limiter.admit("a", "prod", "chat")
    with pytest.raises(OpenAIError) as caught:
        limiter.admit("a", "prod", "chat")
    assert caught.value.status == 429
    assert caught.value.headers()["Retry-After"] == "30"
    limiter.admit("b", "prod", "chat")  # the feature's third request
    with pytest.raises(OpenAIError):
        limiter.admit("c", "prod", "chat")  # the feature is out: key c must not have paid
    clock.now += 20  # one feature request refilled
    limiter.admit("c", "prod", "chat")


def test_features_of_the_same_name_in_two_namespaces_have_their_own_buckets() -> None:
    clock = Clock()
    limiter = RateLimiter(per_feature=Limits(requests_per_minute=2, tokens_per_minute=600), clock=clock)
    limiter.admit(None, "team-a", "chat")
    limiter.admit(None, "team-a", "chat")
    with pytest.raises(OpenAIError) as caught:
        limiter.admit(None, "team-a", "chat")
    assert "requests per minute for this feature" in caught.value.message
    limiter.admit(None, "team-b", "chat")  # team B's chat is untouched by team A's traffic
    limiter.charge_tokens(None, "team-b", "chat", 1000)  # team B into debt ...
    with pytest.raises(OpenAIError):
        limiter.admit(None, "team-b", "chat")
    clock.now += 30  # ... team A's requests refill, its tokens were never charged
    limiter.admit(None, "team-a", "chat")


def test_token_limit_charges_usage_after_the_fact() -> None:
    clock = Clock()
    limiter = RateLimiter(per_key=Limits(tokens_per_minute=600), clock=clock)
    limiter.admit("a", "prod", "chat")
    limiter.charge_tokens("a", "prod", "chat", 900)  # into debt by 300 tokens
    with pytest.raises(OpenAIError) as caught:
        limiter.admit("a", "prod", "chat")
    assert caught.value.headers()["Retry-After"] == "31"  # 301 tokens at 10 per second
    clock.now += 31
    limiter.admit("a", "prod", "chat")


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
