"""`gateway.responseCache` of the chart: the admin's bounds over every AIFeature's responseCache reach the
gateway as it parses them (a share of a quarter of the cap unless set), and its Redis is another database
of the limits' Redis, or one of its own whose URL comes from a Secret, never a plain value with a password."""

from __future__ import annotations

from typing import Any

from servlane_gateway.flags import parse_settings
from tests.support.helmtool import CHART, Helm, one

GATEWAY = "mp-servlane-gateway"


def gateway_env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    container = one(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container.get("env", [])}


def values(env: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: e["value"] for name, e in env.items() if "value" in e}


def test_the_default_bounds_reach_the_gateway(helm: Helm) -> None:
    settings = parse_settings(["--watch"], values(gateway_env(helm.template())))
    assert (settings.cache_max_bytes, settings.cache_max_entry_bytes) == (256 << 20, 4 << 20)
    assert settings.cache_namespace_max_bytes is None  # a quarter of the cap
    assert settings.cache_redis is None  # no Redis: each process's memory


def test_set_bounds_and_the_limits_redis_at_another_database(helm: Helm) -> None:
    env = gateway_env(
        helm.template(
            set_values=(
                "gateway.responseCache.maxBytes=1048576",
                "gateway.responseCache.namespaceMaxBytes=65536",
                "gateway.responseCache.maxEntryBytes=8192",
                "gateway.rateLimits.redis.url=redis://redis.data:6379/0",
            )
        )
    )
    settings = parse_settings(["--watch"], values(env))
    bounds = (settings.cache_max_bytes, settings.cache_namespace_max_bytes, settings.cache_max_entry_bytes)
    assert bounds == (1 << 20, 64 << 10, 8192)
    assert settings.cache_redis == "redis://redis.data:6379/1"
    chosen = ("gateway.rateLimits.redis.url=redis://redis.data:6379/0", "gateway.responseCache.redis.database=5")
    assert parse_settings(["--watch"], values(gateway_env(helm.template(set_values=chosen)))).cache_redis == (
        "redis://redis.data:6379/5"
    )


def test_a_cache_redis_of_its_own_comes_from_a_secret_or_a_url_without_password(helm: Helm) -> None:
    env = gateway_env(helm.template(set_values=("gateway.responseCache.redis.existingSecret=cache-redis",)))
    url = env["SERVLANE_GATEWAY_CACHE_REDIS_URL"]
    assert url["valueFrom"] == {"secretKeyRef": {"name": "cache-redis", "key": "url"}}
    plain = gateway_env(helm.template(set_values=("gateway.responseCache.redis.url=redis://cache:6379/0",)))
    assert plain["SERVLANE_GATEWAY_CACHE_REDIS_URL"]["value"] == "redis://cache:6379/0"
    for bad in ("gateway.responseCache.redis.url=redis://:pw@cache:6379", "gateway.responseCache.maxBytes=-1"):
        result = helm.run("template", "mp", str(CHART), "--set", bad, check=False)
        assert result.returncode != 0
        assert "values don't meet the specifications of the schema" in result.stderr


def test_a_cache_redis_of_its_own_keeps_the_release_scoped_key_prefix(helm: Helm) -> None:
    """Without the limits' Redis the cache's keys still carry servlane:<release namespace>:<gateway>: two
    releases sharing the cache's Redis keep apart budgets (its byte sums live under the prefix)."""
    for own in ("gateway.responseCache.redis.url=redis://cache:6379/0", "gateway.responseCache.redis.existingSecret=c"):
        for namespace in ("team-x", "team-y"):
            env = gateway_env(helm.template(set_values=(own,), namespace=namespace))
            assert env["SERVLANE_GATEWAY_REDIS_KEY_PREFIX"]["value"] == f"servlane:{namespace}:mp-servlane-gateway"
    chosen = ("gateway.responseCache.redis.url=redis://cache:6379/0", "gateway.rateLimits.redis.keyPrefix=shared-x")
    assert gateway_env(helm.template(set_values=chosen))["SERVLANE_GATEWAY_REDIS_KEY_PREFIX"]["value"] == "shared-x"
    assert "SERVLANE_GATEWAY_REDIS_KEY_PREFIX" not in gateway_env(helm.template())  # no Redis: nothing to prefix
