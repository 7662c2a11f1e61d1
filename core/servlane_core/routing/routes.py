"""The route table: which backends answer each model name, built by pure functions from API objects.

A feature's weights come from AIFeature.status.weights (what the operator's rollout currently applies);
before the operator has written a status, the spec (split, or model at 100) stands in so a fresh
gateway still routes. An AIModel gets traffic only when its Ready condition is True and its status
has an endpoint. Every AIModel can also be called directly by its served model name, and each of its LoRA
adapters by the adapter's name; a feature targets an adapter as `model:adapter` (servlane_api.targets).

Names: `namespace/name` always addresses exactly one feature (or, failing that, one AIModel by its
served name) in that namespace. A plain `name` resolves only within the serving namespaces the gateway
is configured with, and only when exactly one of them holds it: a name held by several is ambiguous and
refused (servlane_core.routing.name_resolution), never given to whichever namespace is listed first, so
a new object in one namespace can never silently take over another namespace's traffic. Objects outside
the serving namespaces are reachable only as `namespace/name` (or, for a caller whose API key names
namespaces, as a plain name resolved in those: see name_resolution). A served
model name containing `/` is refused (not routable by that name): it could be read as `namespace/name`.
The CRD already refuses `/` in spec.servedModelName; this also covers a name reported in the status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from servlane_api import AIFeature, AIModel
from servlane_api.aifeature import FeatureDefaults, ResponseCache, WeightedModel
from servlane_api.aimodel import AIModelSpec
from servlane_api.children import service_base_url
from servlane_api.targets import Target, parse_target
from servlane_core.routing.model_version import answer_version


@dataclass(frozen=True)
class Backend:
    model: str  # the AIModel's name: the `model` label of the metrics
    namespace: str
    base_url: str  # e.g. http://chat-v2.prod.svc.cluster.local:8000 ("" when the model has no endpoint yet)
    served_model_name: str  # what the backend expects in the request's `model`
    ready: bool
    weight: int
    version: str = ""  # model_version.answer_version of its spec: keys the gateway's response cache
    wakes: bool = False  # not ready, but its pods are on their way: requests are held (waking.can_wake)


@dataclass(frozen=True)
class Route:
    name: str  # what clients send as `model` (without the namespace); also the `feature` label
    namespace: str
    backends: tuple[Backend, ...]
    defaults: FeatureDefaults = field(default_factory=FeatureDefaults)
    is_feature: bool = True
    response_cache: ResponseCache = field(default_factory=ResponseCache)  # off unless the feature opts in
    routing: str = "least-load"  # how a pod of the picked backend is chosen (endpoint_pick)
    created: int = 0  # the object's creationTimestamp in Unix seconds: /v1/models' `created`

    @cached_property
    def candidates(self) -> tuple[tuple[Backend, ...], tuple[int, ...]]:
        """The backends a request may go to and their weights: the ready ones with a positive weight, or, when
        every ready one has weight 0, all ready ones at 1 each (a feature whose weighted backends are all down
        still answers from whatever is up). Worked out once per route (a route never changes: a new table
        brings new ones), not per request (servlane_core.routing.picking)."""
        return weighted_candidates(self.backends)


def weighted_candidates(backends: Iterable[Backend]) -> tuple[tuple[Backend, ...], tuple[int, ...]]:
    """Of `backends`, the ones a request may go to and their weights (the rule Route.candidates states)."""
    ready = tuple(b for b in backends if b.ready)
    weighted = tuple(b for b in ready if b.weight > 0)
    if weighted:
        return weighted, tuple(b.weight for b in weighted)
    return ready, (1,) * len(ready)


@dataclass(frozen=True)
class RouteTable:
    # `namespace/name` -> route: every feature and every directly callable AIModel.
    routes: dict[str, Route] = field(default_factory=dict)
    # plain name -> route, only from the serving namespaces and only names exactly one of them holds
    # (see resolve_plain_names).
    plain: dict[str, Route] = field(default_factory=dict)
    serving_namespaces: tuple[str, ...] = ()
    # Plain names held in several serving namespaces: name -> those namespaces, in serving order. Refused
    # as ambiguous; each object stays reachable as `namespace/name`.
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # `namespace/aimodel` of AIModels whose served name contains `/`: not callable by that name.
    refused: tuple[str, ...] = ()

    def lookup(self, name: str) -> Route | None:
        """`namespace/name` addresses that namespace only; a plain name only the serving namespaces, and
        only when exactly one holds it (None for an ambiguous name: name_resolution says why)."""
        return self.routes.get(name) if "/" in name else self.plain.get(name)

    def names(self) -> list[str]:
        """Every name that lookup() answers once: the plain names, and `namespace/name` for the routes
        that no plain name reaches (those outside the serving namespaces, and ambiguous ones)."""
        reached = {id(route) for route in self.plain.values()}
        qualified = [key for key, route in self.routes.items() if id(route) not in reached]
        return sorted(self.plain) + sorted(qualified)


def is_ready(model: AIModel) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in model.status.conditions)
    return ready and bool(model.status.endpoint)


WAKING_PHASES = ("Pending", "Deploying")


def can_wake(model: AIModel) -> bool:
    """Whether a request for this not-ready model waits for its pods rather than getting a 503 (see
    servlane_core.routing.waking): its pods are on their way and it has an endpoint; not when it is fixed at
    `spec.replicas: 0`, which nothing scales back."""
    if not model.status.endpoint or model.status.phase not in WAKING_PHASES:
        return False
    return not (model.spec.autoscaling is None and model.spec.replicas == 0)


def _served_name(model: AIModel) -> str:
    return model.status.served_model_name or model.served_model_name


def _base_url(model: AIModel, cluster_domain: str | None) -> str:
    """Where the model's backend answers ("" before it has an endpoint). In the cluster (`cluster_domain`
    given), the AIModel's own Service, from its name and namespace (servlane_api.children): status is
    writable by anyone who may patch `aimodels/status`, so status.endpoint only says that the model is up,
    never where (else it could send callers to another team's pods). Without a cluster domain (a routes
    file, written by the same trusted process that started the runtimes), status.endpoint is the URL."""
    if not model.status.endpoint:
        return ""
    if cluster_domain is not None:
        return service_base_url(model.name, model.namespace, cluster_domain)
    # status.endpoint is the OpenAI base URL (…:8000/v1); the proxy appends /v1/<endpoint> itself.
    return model.status.endpoint.rstrip("/").removesuffix("/v1")


def _backend(model: AIModel, weight: int, adapter: str | None, cluster_domain: str | None, version: str) -> Backend:
    """The model's pods; with `adapter`, the same pods answering as that LoRA adapter (the target
    `model:adapter` is its metrics label, so a canary between adapters is measured per adapter). `version`:
    the model's answer_version (build_route_table digests each spec once)."""
    listed = adapter is None or any(a.name == adapter for a in model.spec.adapters)
    return Backend(
        model=str(Target(model.name, adapter)),
        namespace=model.namespace,
        base_url=_base_url(model, cluster_domain),
        served_model_name=_served_name(model) if adapter is None else adapter,
        ready=is_ready(model) and listed,
        weight=weight,
        version=version + ("" if adapter is None else f":{adapter}"),
        wakes=listed and can_wake(model),
    )


def feature_weights(feature: AIFeature) -> list[WeightedModel]:
    """The split to apply: status.weights when the operator wrote it, else what the spec asks for."""
    if feature.status.weights:
        return list(feature.status.weights)
    if feature.spec.split is not None:
        return list(feature.spec.split)
    assert feature.spec.model is not None  # the spec validator guarantees model xor split
    return [WeightedModel(model=feature.spec.model, weight=100)]


def _feature_route(
    feature: AIFeature,
    models: dict[tuple[str, str], AIModel],
    cluster_domain: str | None,
    versions: dict[tuple[str, str], str],
) -> Route:
    backends: list[Backend] = []
    for weighted in feature_weights(feature):
        target = parse_target(weighted.model)
        model = models.get((feature.namespace, target.model))
        if model is None:
            # A weight on a missing AIModel still shows up (not ready) so the weights gauge tells the truth.
            backends.append(Backend(weighted.model, feature.namespace, "", weighted.model, False, weighted.weight))
        else:
            version = versions[(feature.namespace, target.model)]
            backends.append(_backend(model, weighted.weight, target.adapter, cluster_domain, version))
    spec = feature.spec
    return Route(
        feature.name,
        feature.namespace,
        tuple(backends),
        spec.defaults,
        True,
        spec.response_cache,
        spec.routing,
        feature.created_unix,
    )


class _VersionMemo:
    """The answer versions of the last build, by spec object. Digesting every spec was most of a rebuild's
    work, and a rebuild runs while requests are served (bench/route_rebuild_bench.py); the sources hand the
    same parsed object to the next build while its manifest is unchanged (the watch parses each object once
    as it comes, the routes file reuses unchanged ones), and a parsed object is never modified. Each entry
    holds its spec, so an id is never that of another object; each build keeps only its own models'."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[AIModelSpec, str]] = {}

    def versions(self, models: dict[tuple[str, str], AIModel]) -> dict[tuple[str, str], str]:
        known, fresh = self._known, {}
        versions: dict[tuple[str, str], str] = {}
        for key, model in models.items():
            spec = model.spec
            entry = known.get(id(spec))
            if entry is None or entry[0] is not spec:
                entry = (spec, answer_version(spec))
            fresh[id(spec)] = entry
            versions[key] = entry[1]
        self._known = fresh  # one assignment: a build on another thread sees the old memo or the new one
        return versions


_answer_versions = _VersionMemo().versions


def build_route_table(
    features: Iterable[AIFeature],
    models: Iterable[AIModel],
    serving_namespaces: Sequence[str] = (),
    *,
    cluster_domain: str | None = None,
) -> RouteTable:
    """Features and AIModels (by served name) as `namespace/name`; a feature wins a clash with a served
    name in its namespace. Plain names come from `serving_namespaces` (resolve_plain_names). With
    `cluster_domain` (the in-cluster watch), each backend is its AIModel's own Service (_base_url)."""
    by_key = {(m.namespace, m.name): m for m in models}
    versions = _answer_versions(by_key)
    routes: dict[str, Route] = {}
    refused: list[str] = []
    for model in sorted(by_key.values(), key=lambda m: (m.namespace, m.name)):
        served = _served_name(model)
        if "/" in served:
            refused.append(f"{model.namespace}/{model.name}")
            continue
        backend = _backend(model, 100, None, cluster_domain, versions[(model.namespace, model.name)])
        route = Route(served, model.namespace, (backend,), is_feature=False, created=model.created_unix)
        routes.setdefault(f"{model.namespace}/{served}", route)
    # Adapters by their own names, after every served name of the namespace (which wins a clash).
    for model in sorted(by_key.values(), key=lambda m: (m.namespace, m.name)):
        for adapter in model.spec.adapters:
            backend = _backend(model, 100, adapter.name, cluster_domain, versions[(model.namespace, model.name)])
            route = Route(adapter.name, model.namespace, (backend,), is_feature=False, created=model.created_unix)
            routes.setdefault(f"{model.namespace}/{adapter.name}", route)
    for feature in features:
        routes[f"{feature.namespace}/{feature.name}"] = _feature_route(feature, by_key, cluster_domain, versions)
    return resolve_plain_names(RouteTable(routes, refused=tuple(refused)), serving_namespaces)


def resolve_plain_names(table: RouteTable, serving_namespaces: Sequence[str]) -> RouteTable:
    """The table with its plain names taken from `serving_namespaces`: a name exactly one of them holds
    is a plain name; one held by several is ambiguous (no namespace wins by its place in the list)."""
    order = {ns: i for i, ns in reversed(list(enumerate(serving_namespaces)))}  # first mention counts
    holders: dict[str, list[Route]] = {}
    for route in table.routes.values():
        if route.namespace in order:
            holders.setdefault(route.name, []).append(route)
    plain: dict[str, Route] = {}
    ambiguous: dict[str, tuple[str, ...]] = {}
    for name, held in sorted(holders.items()):
        if len(held) == 1:
            plain[name] = held[0]
        else:
            ambiguous[name] = tuple(sorted((r.namespace for r in held), key=order.__getitem__))
    serving = tuple(dict.fromkeys(serving_namespaces))
    return dataclasses.replace(table, plain=plain, serving_namespaces=serving, ambiguous=ambiguous)


def describe_ambiguity(table: RouteTable) -> list[str]:
    """One line per plain name that several serving namespaces hold: refused, and how to call each."""
    return [
        f"model name {name!r} is held by serving namespaces {', '.join(repr(ns) for ns in holders)}: a request "
        f"for plain {name!r} is refused as ambiguous (400 ambiguous_model) unless the caller's API key names "
        f"only one of them; call it as '<namespace>/{name}'"
        for name, holders in table.ambiguous.items()
    ]


def describe_refused(table: RouteTable) -> list[str]:
    """One line per AIModel whose served name contains `/` (it would read as `namespace/name`)."""
    return [
        f"AIModel {key!r}: its served model name contains '/', which is reserved for '<namespace>/<name>'; "
        "it is not callable by that name (a feature pointing at it still works)"
        for key in table.refused
    ]
