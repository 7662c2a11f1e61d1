"""Endpoint overrides: rewrite backend base URLs by prefix, for a gateway running outside the cluster.

The operator writes cluster-DNS endpoints (http://chat-v1.prod.svc.cluster.local:8000/v1). A gateway on a
laptop (with `kubectl port-forward`) or in an e2e test (runtimes as local processes) cannot reach them,
so `--endpoint-override http://chat-v1.prod.svc.cluster.local:8000=http://127.0.0.1:39001` maps one
prefix onto another. The longest matching prefix wins, and a prefix matches only whole URL parts
(`http://a:8000` does not match `http://a:80001`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

from servlane_core.routing.routes import Route, RouteTable


def normalise(url: str) -> str:
    """Compare base URLs the way routes.py stores them: no trailing slash, no trailing /v1."""
    return url.strip().rstrip("/").removesuffix("/v1")


def parse_override_items(items: Iterable[str]) -> dict[str, str]:
    """`FROM=TO` items (the flag, repeated) into a mapping; ValueError on a malformed item."""
    overrides: dict[str, str] = {}
    for item in items:
        source, sep, target = item.partition("=")
        if not sep or "://" not in source or "://" not in target:
            raise ValueError(f"expected an endpoint override as URL=URL, got {item!r}")
        overrides[normalise(source)] = normalise(target)
    return overrides


def parse_override_env(value: str) -> dict[str, str]:
    """The environment form: a JSON object {"FROM": "TO"}, or a comma-separated list of FROM=TO."""
    text = value.strip()
    if text.startswith("{"):
        loaded = json.loads(text)
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise ValueError("endpoint overrides as JSON must be an object of strings")
        return parse_override_items(f"{k}={v}" for k, v in loaded.items())
    return parse_override_items(part for part in text.split(",") if part.strip())


def rewrite_url(url: str, overrides: Mapping[str, str]) -> str:
    """`url` with its longest overridden prefix replaced; unchanged when none matches."""
    best = ""
    for prefix in overrides:
        rest = url[len(prefix) :]
        if url.startswith(prefix) and (not rest or rest[0] in "/?") and len(prefix) > len(best):
            best = prefix
    return overrides[best] + url[len(best) :] if best else url


def apply_overrides(table: RouteTable, overrides: Mapping[str, str]) -> RouteTable:
    """The table with every backend's base URL rewritten (routes shared by aliases stay shared)."""
    if not overrides:
        return table
    rewritten: dict[int, Route] = {}

    def rewrite(route: Route) -> Route:
        if id(route) not in rewritten:
            backends = tuple(
                dataclasses.replace(b, base_url=rewrite_url(b.base_url, overrides)) if b.base_url else b
                for b in route.backends
            )
            rewritten[id(route)] = dataclasses.replace(route, backends=backends)
        return rewritten[id(route)]

    routes = {name: rewrite(route) for name, route in table.routes.items()}
    plain = {name: rewrite(route) for name, route in table.plain.items()}
    return dataclasses.replace(table, routes=routes, plain=plain)
