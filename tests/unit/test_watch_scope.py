"""The operator's list and watch requests for its children carry the owned-label selector (issue 19).

The requests are built by kopf's own list/watch code (`continuous_watch`: the initial list, then the
watch) from the settings our real startup handler leaves behind; only kopf's two HTTP calls are replaced,
so the test sees the exact URLs kopf would send. It fails if the selector is dropped from startup, if a
handler watches a built-in kind without one, or if a kopf upgrade stops sending the setting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kopf
import pytest
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs.references import NamespaceName, Resource, Selector

from servlane_api import GROUP, VERSION
from servlane_operator import handlers
from servlane_operator.settings import OperatorSettings
from servlane_operator.watch_scope import CHILD_KINDS, LEASES, OWNED_SELECTOR, restrict_watches

PODS = Resource("", "v1", "pods", kind="Pod", namespaced=True, verbs=frozenset({"list", "watch"}))
DEPLOYMENTS = Resource(
    "apps", "v1", "deployments", kind="Deployment", namespaced=True, verbs=frozenset({"list", "watch"})
)
AIMODELS = Resource(GROUP, VERSION, "aimodels", kind="AIModel", namespaced=True, verbs=frozenset({"list", "watch"}))
LEASE_RESOURCE = Resource(
    "coordination.k8s.io", "v1", "leases", kind="Lease", namespaced=True, verbs=frozenset({"list", "watch"})
)
OTHER = Resource("", "v1", "configmaps", kind="ConfigMap", namespaced=True, verbs=frozenset({"list", "watch"}))


async def started_settings(monkeypatch: pytest.MonkeyPatch) -> kopf.OperatorSettings:
    """kopf's settings after our real startup handler, with its cluster and HTTP side effects stubbed."""
    monkeypatch.setattr(handlers, "start_http_server", lambda port: None)
    settings = kopf.OperatorSettings()
    # kopf's decorator types the handler as kopf calls it (every kopf kwarg); startup reads only these.
    startup: Any = handlers.startup
    memo = SimpleNamespace(settings=OperatorSettings(gateway_namespace="gw"), peering=None)
    await startup(settings=settings, memo=memo, logger=logging.getLogger(__name__))
    return settings


async def requested_urls(
    monkeypatch: pytest.MonkeyPatch, settings: kopf.OperatorSettings, resource: Resource, namespace: str | None
) -> list[str]:
    """The URLs of one list-then-watch cycle of kopf for `resource`, as kopf builds them."""
    urls: list[str] = []
    paused = asyncio.get_running_loop().create_future()

    async def fake_get(url: str, **_: Any) -> dict[str, Any]:
        urls.append(url)
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    async def fake_stream(url: str, **_: Any) -> AsyncIterator[Any]:
        urls.append(url)
        paused.set_result(None)  # ends kopf's watch loop after this one watch request
        events: list[Any] = []  # an empty stream, as when the server closes it
        for event in events:
            yield event

    monkeypatch.setattr(kopf_api, "get", fake_get)
    monkeypatch.setattr(kopf_api, "stream", fake_stream)
    stream = kopf_watching.continuous_watch(
        settings=settings,
        resource=resource,
        namespace=None if namespace is None else NamespaceName(namespace),
        operator_pause_waiter=paused,
    )
    async with asyncio.timeout(10):
        async for _ in stream:
            pass
    return urls


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


@pytest.mark.parametrize("resource", [PODS, DEPLOYMENTS], ids=["pods", "deployments"])
@pytest.mark.parametrize("namespace", [None, "team-a"], ids=["cluster-wide", "namespaced"])
async def test_child_list_and_watch_ask_only_for_owned_objects(
    monkeypatch: pytest.MonkeyPatch, resource: Resource, namespace: str | None
) -> None:
    settings = await started_settings(monkeypatch)
    urls = await requested_urls(monkeypatch, settings, resource, namespace)
    assert len(urls) == 2, urls  # the initial list, then the watch
    list_url, watch_url = urls
    assert "watch" not in query(list_url)
    assert query(watch_url)["watch"] == ["true"]
    for url in urls:
        assert query(url)["labelSelector"] == ["app.kubernetes.io/managed-by=servlane-operator"], url
        prefix = "/apis/apps/v1" if resource is DEPLOYMENTS else "/api/v1"
        scope = f"/namespaces/{namespace}" if namespace else ""
        assert urlsplit(url).path == f"{prefix}{scope}/{resource.plural}", url


@pytest.mark.parametrize("resource", [AIMODELS, OTHER], ids=["aimodels", "configmaps"])
async def test_other_kinds_are_not_filtered(monkeypatch: pytest.MonkeyPatch, resource: Resource) -> None:
    """Every AIModel is ours whatever its labels; and the selector is scoped to the child kinds only."""
    settings = await started_settings(monkeypatch)
    urls = await requested_urls(monkeypatch, settings, resource, None)
    assert urls
    assert all("labelSelector" not in query(url) for url in urls), urls


def test_every_built_in_kind_the_handlers_watch_is_filtered_on_the_server() -> None:
    """A handler added on another built-in kind (Services, say) must get a server-side selector too."""
    registry = kopf.get_default_registry()
    # kopf has no public listing of the registered handlers' resources; these are its sub-registries.
    watched: set[Selector] = {
        *registry._indexing.get_all_selectors(),
        *registry._watching.get_all_selectors(),
        *registry._changing.get_all_selectors(),
        *registry._spawning.get_all_selectors(),
    }
    built_in = {(s.group, s.version, s.any_name) for s in watched if s.group != GROUP}
    assert built_in == {*CHILD_KINDS, LEASES}
    settings = kopf.OperatorSettings()
    restrict_watches(settings)
    for kind in CHILD_KINDS:
        assert settings.watching.label_selectors[kind] == OWNED_SELECTOR
    assert settings.watching.label_selectors[LEASES] == "app.kubernetes.io/managed-by=servlane-gateway"


@pytest.mark.parametrize("namespace", [None, "team-a"], ids=["cluster-wide", "namespaced"])
async def test_leases_are_listed_and_watched_only_for_the_gateways_demand(
    monkeypatch: pytest.MonkeyPatch, namespace: str | None
) -> None:
    """Every node and every leader election has a Lease: the operator asks only for the gateway's."""
    settings = await started_settings(monkeypatch)
    urls = await requested_urls(monkeypatch, settings, LEASE_RESOURCE, namespace)
    assert len(urls) == 2, urls
    for url in urls:
        assert query(url)["labelSelector"] == ["app.kubernetes.io/managed-by=servlane-gateway"], url


def test_a_kopf_without_server_side_selectors_is_refused() -> None:
    old_kopf = SimpleNamespace(watching=SimpleNamespace())
    with pytest.raises(RuntimeError, match="label_selectors"):
        restrict_watches(old_kopf)  # type: ignore[arg-type]
