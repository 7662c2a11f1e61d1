"""Reading what the chart renders: a Deployment's containers and the env of its first container."""

from __future__ import annotations

from typing import Any


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in containers(deployment)[0].get("env", [])}
