"""`gateway.batch` of the chart: off by default (no database variables), on it passes the database URL
from the Secret named (never as a plain value) and the worker's settings; the schema refuses turning it on
without that Secret."""

from __future__ import annotations

from typing import Any

from tests.support.helmtool import CHART, Helm, one

GATEWAY = "mp-servlane-gateway"


def gateway_env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    container = one(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container.get("env", [])}


def test_the_batch_api_is_off_by_default(helm: Helm) -> None:
    env = gateway_env(helm.template())
    assert not [name for name in env if name.startswith("SERVLANE_GATEWAY_BATCH_")]


def test_enabled_it_reads_the_database_url_from_the_secret_and_passes_the_worker_settings(helm: Helm) -> None:
    objects = helm.template(
        set_values=(
            "gateway.apiKeys.existingSecret=keys",
            "gateway.batch.enabled=true",
            "gateway.batch.databaseUrl.secretName=batch-db",
            "gateway.batch.databaseUrl.key=dsn",
            "gateway.batch.concurrencyPerFeature=7",
            "gateway.batch.leaseSeconds=45",
            "gateway.batch.uploadsAtOnce=6",
        )
    )
    env = gateway_env(objects)
    assert env["SERVLANE_GATEWAY_BATCH_UPLOADS_AT_ONCE"]["value"] == "6"
    assert env["SERVLANE_GATEWAY_BATCH_UPLOADS_AT_ONCE_PER_KEY"]["value"] == "2"
    assert "SERVLANE_GATEWAY_BATCH_ALLOW_WITHOUT_KEYS" not in env
    assert env["SERVLANE_GATEWAY_BATCH_MAX_OWNER_BYTES"]["value"] == "10737418240"
    url = env["SERVLANE_GATEWAY_BATCH_DATABASE_URL"]
    assert "value" not in url
    assert url["valueFrom"] == {"secretKeyRef": {"name": "batch-db", "key": "dsn"}}
    assert env["SERVLANE_GATEWAY_BATCH_CONCURRENCY_PER_FEATURE"]["value"] == "7"
    assert env["SERVLANE_GATEWAY_BATCH_LEASE_SECONDS"]["value"] == "45"
    assert env["SERVLANE_GATEWAY_BATCH_MAX_FILE_BYTES"]["value"] == "209715200"


def test_the_schema_refuses_the_batch_api_without_a_database_secret_or_with_bad_settings(helm: Helm) -> None:
    for settings in (
        ["gateway.batch.enabled=true"],
        [
            "gateway.batch.enabled=true",
            "gateway.batch.databaseUrl.secretName=s",
            "gateway.batch.concurrencyPerFeature=0",
        ],
        ["gateway.batch.databaseUrl.url=postgresql://u:p@h/db"],  # no plain URL: it carries a password
    ):
        args = [arg for setting in settings for arg in ("--set", setting)]
        result = helm.run("template", "mp", str(CHART), *args, check=False)
        assert result.returncode != 0, settings
        assert "values don't meet the specifications of the schema" in result.stderr


def test_the_batch_api_without_api_keys_is_refused_unless_acknowledged(helm: Helm) -> None:
    enabled = ("--set", "gateway.batch.enabled=true", "--set", "gateway.batch.databaseUrl.secretName=s")
    refused = helm.run("template", "mp", str(CHART), *enabled, check=False)
    assert refused.returncode != 0
    assert "gateway.batch.enabled needs API keys" in refused.stderr
    acknowledged = helm.template(
        set_values=(
            "gateway.batch.enabled=true",
            "gateway.batch.databaseUrl.secretName=s",
            "gateway.batch.allowWithoutKeys=true",
        )
    )
    assert gateway_env(acknowledged)["SERVLANE_GATEWAY_BATCH_ALLOW_WITHOUT_KEYS"]["value"] == "true"


def test_the_gateways_tmp_has_a_size_limit(helm: Helm) -> None:
    for values, limit in (((), "1Gi"), (("gateway.tmpSizeLimit=3Gi",), "3Gi")):
        pod = one(helm.template(set_values=values), "Deployment", GATEWAY)["spec"]["template"]["spec"]
        (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
        assert tmp["emptyDir"] == {"sizeLimit": limit}
