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
from servlane_gateway.access import MIN_KEY_LENGTH, ApiKey, KeyRing, parse_keys, route_for
from servlane_gateway.flags import parse_settings
from servlane_gateway.limits.rates import Limits, RateLimiter, TokenBucket
from servlane_gateway.routing.sources import parse_objects
from tests.support.gateway_harness import aifeature

ALPHA, BRAVO, OPS = "sk-alpha-0123456789abcdef0123456789", "sk-bravo-0123456789abcdef0123456789", "sk-ops#2"
KEYS = f"""
# team keys
team-a: {ALPHA}
team-b: {BRAVO} prod/chat,prod/embed
ops: sha256:{{digest}}
"""


class Clock:
    """A clock the test moves by hand, so bucket refills are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ring() -> KeyRing:
    return KeyRing(parse_keys(KEYS.format(digest=hashlib.sha256(OPS.encode()).hexdigest())))


def test_keys_are_held_as_hashes_and_found_by_the_bearer_token() -> None:
    keys = ring()
    assert keys.enabled
    assert all(b"sk-" not in k.digest and len(k.digest) == 32 for k in keys.keys)
    assert keys.authenticate(f"Bearer {ALPHA}").name == "team-a"  # type: ignore[union-attr]
    assert keys.authenticate(f"bearer {OPS}").name == "ops"  # type: ignore[union-attr]
    assert keys.find("sk-nope") is None


def test_among_many_teams_keys_each_key_finds_its_own_entry_and_no_other() -> None:
    secrets = [f"sk-team-{n:05d}-0123456789abcdef0123" for n in range(5000)]
    lines = [f"team-{n}: {secret} ns-{n}/*" for n, secret in enumerate(secrets)]
    lines.append(f"hashed: sha256:{hashlib.sha256(OPS.encode()).hexdigest()}")
    keys = KeyRing(parse_keys("\n".join(lines)))
    for n in (0, 1, 2500, 4999):
        found = keys.find(secrets[n])
        assert found is not None
        assert (found.name, found.namespaces) == (f"team-{n}", (f"ns-{n}",))
    assert keys.find(OPS).name == "hashed"  # type: ignore[union-attr]
    assert keys.find(secrets[7] + "x") is None
    assert keys.find(secrets[7][:-1]) is None
    assert keys.find(hashlib.sha256(secrets[7].encode()).hexdigest()) is None  # a stored hash is not a key


def test_one_key_under_two_names_authenticates_as_the_later_entry() -> None:
    keys = KeyRing(parse_keys(f"first: {ALPHA}\nsecond: {ALPHA} prod/*\n"))
    assert keys.authenticate(f"Bearer {ALPHA}").name == "second"  # type: ignore[union-attr]


@pytest.mark.parametrize("header", [None, "", "Bearer", f"Basic {ALPHA}", "Bearer sk-wrong"])
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


def resolved(key: ApiKey | None, name: str, table: RouteTable | None = None) -> str:
    """Where a request of `key` for `name` goes (`namespace/name`), else its error code."""
    try:
        route = route_for(key, table or routes(), name)
    except OpenAIError as refused:
        error = refused
    else:
        return f"{route.namespace}/{route.name}"
    # Out of scope reads as missing: a refusal must not tell which names exist elsewhere.
    assert (error.status, error.code) in {(404, "model_not_found"), (400, "ambiguous_model")}
    return str(error.code)


def may_call(key: ApiKey | None, name: str, table: RouteTable | None = None) -> bool:
    return "/" in resolved(key, name, table)


def scoped(scopes: str) -> ApiKey:
    key = parse_keys(f"k: {ALPHA} {scopes}")[0]
    assert key.scopes is not None
    return key


def test_keys_limited_to_features_get_404_elsewhere() -> None:
    keys = ring()
    team_b = keys.authenticate(f"Bearer {BRAVO}")
    assert resolved(team_b, "chat") == "prod/chat"
    assert not may_call(team_b, "summarise")
    assert not may_call(team_b, "staging/chat")
    assert resolved(keys.authenticate(f"Bearer {ALPHA}"), "summarise") == "prod/summarise"
    assert may_call(None, "team-b/search")  # access control off


def test_a_plain_scope_is_refused_by_line_number_saying_to_name_the_namespace() -> None:
    """A plain scope followed whatever the name resolved to: another team's new `chat` took the key along."""
    with pytest.raises(ValueError, match=r"^line 3: a scope needs its namespace: write 'namespace/name'") as caught:
        parse_keys(f"# keys\nok: {ALPHA} prod/*\nteam-b: sk-secret-0123456789abcdef0123456789 chat\n")
    assert "secret" not in str(caught.value)
    assert "chat" not in str(caught.value)


def test_a_scoped_keys_plain_names_resolve_in_its_own_namespaces() -> None:
    exact = scoped("team-b/chat")
    assert exact.namespaces == ("team-b",)
    assert resolved(exact, "chat") == "team-b/chat"  # its own, though prod and staging serve a `chat` too
    assert resolved(exact, "team-b/chat") == "team-b/chat"
    assert resolved(exact, "prod/chat") == "model_not_found"
    assert resolved(exact, "team-b/search") == "model_not_found"
    assert resolved(exact, "search") == "model_not_found"  # in its namespace, but not in its scope
    team_b = scoped("team-b/*")
    assert [resolved(team_b, n) for n in ("chat", "search", "summarise")] == [
        "team-b/chat", "team-b/search", "model_not_found"
    ]  # fmt: skip
    # Only what the key may call is a candidate: prod's `chat` neither answers nor makes `chat` ambiguous.
    both = scoped("prod/summarise,team-b/*")
    assert both.namespaces == ("prod", "team-b")
    assert [resolved(both, n) for n in ("summarise", "search", "chat")] == [
        "prod/summarise", "team-b/search", "team-b/chat"
    ]  # fmt: skip


def test_a_name_several_of_the_callers_namespaces_hold_is_refused_naming_only_what_it_may_call() -> None:
    key = scoped("staging/*,prod/*")
    with pytest.raises(OpenAIError) as caught:
        route_for(key, routes(), "chat")
    error = caught.value.body()["error"]
    assert (caught.value.status, error["code"], error["param"]) == (400, "ambiguous_model", "model")
    assert "'staging/chat', 'prod/chat'" in error["message"]  # in the key's order
    assert "team-b" not in error["message"]
    assert resolved(key, "prod/chat") == "prod/chat"  # the way out it names


def test_without_namespaces_a_name_two_serving_namespaces_hold_is_ambiguous_not_the_first_ones() -> None:
    for caller in (None, ring().authenticate(f"Bearer {ALPHA}")):  # keys off; an unscoped (admin) key
        with pytest.raises(OpenAIError) as caught:
            route_for(caller, routes(), "chat")
        assert (caught.value.status, caught.value.code) == (400, "ambiguous_model")
        assert "'prod/chat', 'staging/chat'" in caught.value.message
        assert "team-b" not in caught.value.message  # not serving: not a candidate
        assert resolved(caller, "summarise") == "prod/summarise"
        assert resolved(caller, "search") == "model_not_found"
    assert resolved(None, "chat", routes(serving=("prod",))) == "prod/chat"


def test_a_keys_namespaces_are_those_its_scopes_name_in_the_order_first_listed() -> None:
    key = scoped("team-b/chat,prod/*,team-b/*")
    assert key.namespaces == ("team-b", "prod")
    assert parse_keys(f"team-a: {ALPHA}")[0].scopes is None
    assert parse_keys(f"team-a: {ALPHA}")[0].namespaces == ()


@pytest.mark.parametrize("scopes", ["*", "chat", "/chat", "prod/", "a/b/c", "Prod/*", "prod_x/chat", "prod/chat,/x"])
def test_malformed_scopes_are_refused_by_line_number(scopes: str) -> None:
    with pytest.raises(ValueError, match="line 2: a scope") as caught:
        parse_keys(f"# keys\nk: sk-secret-0123456789abcdef0123456789 {scopes}")
    assert "sk-secret" not in str(caught.value)


def test_no_keys_file_means_access_control_off_but_a_file_without_keys_refuses_everyone() -> None:
    assert KeyRing().authenticate(None) is None
    empty = KeyRing(parse_keys("# none yet\n"))
    for header in (None, f"Bearer {ALPHA}"):
        with pytest.raises(OpenAIError) as caught:
            empty.authenticate(header)
        assert caught.value.status == 403


def test_a_keys_file_that_does_not_parse_refuses_everyone_without_saying_what_it_holds() -> None:
    broken = KeyRing.unparsable()
    assert broken.enabled
    for header in (None, f"Bearer {ALPHA}"):
        with pytest.raises(OpenAIError) as caught:
            broken.authenticate(header)
        assert (caught.value.status, caught.value.code) == (403, "api_keys_invalid")
        assert "does not parse" in caught.value.message


@pytest.mark.parametrize(
    "text",
    ["just-a-key", "name:", f"a: {ALPHA}\na: {BRAVO}", "x: sha256:abcd", f"x: {ALPHA} prod/a prod/b"],
)
def test_malformed_key_files_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        parse_keys(text)


def test_plaintext_keys_need_32_characters_but_digests_are_taken_as_they_are() -> None:
    assert len(parse_keys(f"a: {'k' * MIN_KEY_LENGTH}")) == 1
    with pytest.raises(ValueError, match=r"^line 2: a key needs at least 32 characters") as caught:
        parse_keys(f"ok: {ALPHA}\nshort: {'s' * (MIN_KEY_LENGTH - 1)}\n")
    assert "sss" not in str(caught.value)
    digest = hashlib.sha256(b"short").hexdigest()  # the operator's choice: the gateway cannot tell its length
    assert KeyRing(parse_keys(f"a: sha256:{digest}")).authenticate("Bearer short").name == "a"  # type: ignore[union-attr]


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
