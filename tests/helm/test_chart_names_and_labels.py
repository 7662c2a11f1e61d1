"""Values the schema accepted that rendered broken or unsafe objects: names past 63 characters or shared by the
operator and the gateway, the chart's own labels replaced, a Redis password in a plain env value, names and
Secret keys read as numbers, one ServiceAccount for both components, an HPA whose minimum passes its maximum."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.helmtool import CHART, Helm

NAMED_KINDS = ("Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def names_by_kind(objects: list[dict[str, object]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for obj in objects:
        if obj["kind"] in NAMED_KINDS:
            found.setdefault(str(obj["kind"]), []).append(str(obj["metadata"]["name"]))  # type: ignore[index]
    return found


@pytest.mark.parametrize(
    ("release", "settings"),
    [
        ("rel", ("fullnameOverride=" + "abcdefghi-" * 5,)),  # the schema's longest: 50
        ("rel", ("nameOverride=servlane-inference-platform-for-the-research-and-dev-cluster",)),
        ("r" * 53, ()),  # helm's longest release name
    ],
)
def test_every_name_fits_and_no_two_components_share_one(helm: Helm, release: str, settings: tuple[str, ...]) -> None:
    """`-metrics` went after a name already cut to 63 (70 characters: the install failed), and a long name cut
    `-operator` and `-gateway` off, so both components' Deployments, accounts and roles had one name."""
    objects = helm.template(set_values=settings, release=release)
    for kind, names in names_by_kind(objects).items():
        assert len(names) == len(set(names)), (kind, names)
        assert all(len(name) <= 63 for name in names), (kind, names)
    metrics = [o for o in objects if o["kind"] == "Service" and str(o["metadata"]["name"]).endswith("-gateway-metrics")]
    assert len(metrics) == 1
    operator = next(o for o in objects if o["kind"] == "Deployment" and "-operator" in o["metadata"]["name"])
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVLANE_PROMETHEUS_GATEWAY_JOB"] == metrics[0]["metadata"]["name"]


@pytest.mark.parametrize(
    "setting",
    [
        "commonLabels.app\\.kubernetes\\.io/part-of=ml-platform",
        "gateway.podLabels.app\\.kubernetes\\.io/component=api",
        "operator.podLabels.app\\.kubernetes\\.io/instance=x",
        # redis-py takes a password from the query string too: it would be a plain env value
        "gateway.rateLimits.redis.url=redis://redis:6379/0?password=hunter2",
        "gateway.responseCache.redis.url=unix:///run/redis.sock?db=1&password=hunter2",
    ],
)
def test_the_schema_refuses_what_would_break_selection_or_expose_a_password(helm: Helm, setting: str) -> None:
    """The chart's own labels are how the operator, the selectors and the model pods' NetworkPolicies find its
    pods: replaced, every model was unreachable (part-of) or the Deployment refused (component)."""
    result = helm.run("template", "mp", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, setting
    assert "values don't meet the specifications of the schema" in result.stderr


def test_names_and_secret_keys_that_read_as_numbers_stay_strings(helm: Helm, tmp_path: Path) -> None:
    values = {
        "operator": {"watchNamespaces": ["2024"], "priorityClassName": "1000"},
        "gateway": {
            "batch": {"enabled": True, "allowWithoutKeys": True, "databaseUrl": {"secretName": "12345", "key": "true"}}
        },
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    objects = helm.template(path, namespace="007")

    def scalars(node: object, path: str = "") -> list[tuple[str, object]]:
        if isinstance(node, dict):
            return [s for key, value in node.items() for s in scalars(value, f"{path}.{key}")]
        if isinstance(node, list):
            return [s for item in node for s in scalars(item, path)]
        return [(path, node)]

    named = (".namespace", ".secretName", ".key", ".priorityClassName", ".secretKeyRef.name")
    for obj in objects:
        for where, value in scalars(obj):
            if where.endswith(named):
                assert isinstance(value, str), (obj["kind"], where, value)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ("operator.serviceAccount.create=false", "gateway.serviceAccount.create=false"),
            "must not share a ServiceAccount",
        ),
        (
            (
                "gateway.autoscaling.enabled=true",
                "gateway.resources.requests.cpu=1",
                "gateway.autoscaling.minReplicas=5",
                "gateway.autoscaling.maxReplicas=2",
            ),
            "minReplicas must not exceed",
        ),
    ],
)
def test_values_that_render_unsafe_or_refused_objects_fail_with_a_reason(
    helm: Helm, settings: tuple[str, ...], message: str
) -> None:
    args = ["template", "mp", str(CHART)]
    for setting in settings:
        args += ["--set", setting]
    result = helm.run(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr
