"""`gateway.apiKeys.entries[].features` names namespaces (a plain name is refused by the schema, as the
gateway refuses it in the keys file), and `gateway.tracing.trustIncomingTraceparent` (off by default)
reaches the gateway as its setting."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.helmtool import CHART, Helm, one

GATEWAY = "mp-servlane-gateway"
DIGEST = "sha256:" + "a" * 64


def gateway_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_a_callers_traceparent_is_not_trusted_unless_set(helm: Helm) -> None:
    assert gateway_env(helm.template())["SERVLANE_GATEWAY_TRUST_TRACEPARENT"] == "false"
    trusted = helm.template(set_values=("gateway.tracing.trustIncomingTraceparent=true",))
    assert gateway_env(trusted)["SERVLANE_GATEWAY_TRUST_TRACEPARENT"] == "true"


def key_entry(feature: str) -> tuple[str, ...]:
    return (
        "--set",
        "gateway.apiKeys.entries[0].name=team-b",
        "--set-string",
        f"gateway.apiKeys.entries[0].key={DIGEST}",
        "--set-string",
        f"gateway.apiKeys.entries[0].features[0]={feature}",
    )


@pytest.mark.parametrize("feature", ["chat", "*", "Team-B/chat", "team-b/", "a/b/c", "team-b/chat x"])
def test_the_schema_refuses_scopes_without_a_namespace(helm: Helm, feature: str) -> None:
    result = helm.run("template", "mp", str(CHART), *key_entry(feature), check=False)
    assert result.returncode != 0
    assert "at '/gateway/apiKeys/entries/0/features/0'" in result.stderr


@pytest.mark.parametrize("feature", ["team-b/chat", "team-b/*"])
def test_namespaced_scopes_render_into_a_keys_file_the_gateway_parses(helm: Helm, feature: str) -> None:
    from servlane_gateway.access import parse_keys

    result = helm.run("template", "mp", str(CHART), *key_entry(feature))
    assert result.returncode == 0
    secret = next(doc for doc in result.stdout.split("\n---\n") if "kind: Secret" in doc)
    text = secret.split("keys: |", 1)[1]
    (key,) = parse_keys("\n".join(line.strip() for line in text.splitlines()))
    assert key.namespaces == ("team-b",)
