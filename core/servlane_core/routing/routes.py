"""The route table: which backends answer each model name, built by a pure function from API objects.

A feature's weights come from AIFeature.status.weights (what the operator's rollout currently applies);
before the operator has written a status, the spec (split, or model at 100) stands in so a fresh
gateway still routes. An AIModel gets traffic only when its Ready condition is True and its status
has an endpoint. Every AIModel can also be called directly by its served model name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from servlane_api import AIFeature, AIModel
from servlane_api.aifeature import FeatureDefaults, WeightedModel


@dataclass(frozen=True)
class Backend:
    model: str  # the AIModel's name: the `model` label of the metrics
    namespace: str
    base_url: str  # e.g. http://chat-v2.prod.svc.cluster.local:8000 ("" when the model has no endpoint yet)
    served_model_name: str  # what the backend expects in the request's `model`
    ready: bool
    weight: int


@dataclass(frozen=True)
class Route:
    name: str  # what clients send as `model`; also the `feature` label
    namespace: str
    backends: tuple[Backend, ...]
    defaults: FeatureDefaults = field(default_factory=FeatureDefaults)
    is_feature: bool = True


@dataclass(frozen=True)
class RouteTable:
    routes: dict[str, Route] = field(default_factory=dict)
    # Plain names held in several namespaces: name -> the namespaces that do not get it (their objects
    # stay reachable as `namespace/name`).
    shadowed: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def lookup(self, name: str) -> Route | None:
        return self.routes.get(name)

    def names(self) -> list[str]:
        """Plain names only (the `namespace/name` aliases are not listed)."""
        return sorted({route.name for route in self.routes.values()})


def is_ready(model: AIModel) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in model.status.conditions)
    return ready and bool(model.status.endpoint)


def _served_name(model: AIModel) -> str:
    return model.status.served_model_name or model.served_model_name


def _backend(model: AIModel, weight: int) -> Backend:
    return Backend(
        model=model.name,
        namespace=model.namespace,
        # status.endpoint is the OpenAI base URL (…:8000/v1); the proxy appends /v1/<endpoint> itself.
        base_url=(model.status.endpoint or "").rstrip("/").removesuffix("/v1"),
        served_model_name=_served_name(model),
        ready=is_ready(model),
        weight=weight,
    )


def feature_weights(feature: AIFeature) -> list[WeightedModel]:
    """The split to apply: status.weights when the operator wrote it, else what the spec asks for."""
    if feature.status.weights:
        return list(feature.status.weights)
    if feature.spec.split is not None:
        return list(feature.spec.split)
    assert feature.spec.model is not None  # the spec validator guarantees model xor split
    return [WeightedModel(model=feature.spec.model, weight=100)]


def _feature_route(feature: AIFeature, models: dict[tuple[str, str], AIModel]) -> Route:
    backends: list[Backend] = []
    for weighted in feature_weights(feature):
        model = models.get((feature.namespace, weighted.model))
        if model is None:
            # A weight on a missing AIModel still shows up (not ready) so the weights gauge tells the truth.
            backends.append(Backend(weighted.model, feature.namespace, "", weighted.model, False, weighted.weight))
        else:
            backends.append(_backend(model, weighted.weight))
    return Route(feature.name, feature.namespace, tuple(backends), feature.spec.defaults, is_feature=True)


def build_route_table(features: Iterable[AIFeature], models: Iterable[AIModel]) -> RouteTable:
    """Features by name and `namespace/name`; AIModels by served name. Features win a name clash, and
    between namespaces the alphabetically first namespace owns the plain name (the others are listed in
    `shadowed`, for the gateway to warn about)."""
    features = list(features)
    by_key = {(m.namespace, m.name): m for m in models}
    routes: dict[str, Route] = {}
    for model in sorted(by_key.values(), key=lambda m: (m.namespace, m.name), reverse=True):
        served = _served_name(model)
        route = Route(served, model.namespace, (_backend(model, 100),), is_feature=False)
        routes[served] = route
        routes[f"{model.namespace}/{served}"] = route
    for feature in sorted(features, key=lambda f: (f.namespace, f.name), reverse=True):
        route = _feature_route(feature, by_key)
        routes[feature.name] = route
        routes[f"{feature.namespace}/{feature.name}"] = route
    holders: dict[str, set[str]] = {}
    for feature in features:
        holders.setdefault(feature.name, set()).add(feature.namespace)
    for model in by_key.values():
        holders.setdefault(_served_name(model), set()).add(model.namespace)
    shadowed = {
        name: tuple(sorted(namespaces - {routes[name].namespace}))
        for name, namespaces in sorted(holders.items())
        if len(namespaces) > 1
    }
    return RouteTable(routes, shadowed)


def describe_shadowing(table: RouteTable) -> list[str]:
    """One line per plain name that several namespaces hold, saying who gets it and how to reach the rest."""
    return [
        f"model name {name!r} routes to namespace {table.routes[name].namespace!r}; "
        f"{', '.join(repr(ns) for ns in losers)} also hold it (call it there as '<namespace>/{name}')"
        for name, losers in table.shadowed.items()
    ]
