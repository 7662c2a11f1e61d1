"""`gateway.batch` of the chart: off by default (no database variables), on it passes the database URL
from the Secret named (never as a plain value) and the worker's settings; the schema refuses turning it on
without that Secret."""

from __future__ import annotations

from typing import Any

from tests.helm.helmtool import CHART, Helm, one

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
            "gateway.batch.enabled=true",
            "gateway.batch.databaseUrl.secretName=batch-db",
            "gateway.batch.databaseUrl.key=dsn",
            "gateway.batch.concurrencyPerFeature=7",
            "gateway.batch.leaseSeconds=45",
        )
    )
    env = gateway_env(objects)
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
