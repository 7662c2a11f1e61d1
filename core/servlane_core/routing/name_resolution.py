"""Which route a caller's `model` names: decided per caller, so one tenant's names never capture another's.

`namespace/name` is exactly that object, for everyone (whether the caller may call it is the key's
business: servlane_gateway.access). A plain `name` resolves where the caller lives:

- a caller whose API key names namespaces (its scopes `namespace/name`, `namespace/*`) looks only in
  those, and only among the routes its key may call: exactly one holds the name -> that route; several
  -> refused as ambiguous, naming them; none -> model_not_found. Another team's new `chat` is neither a
  candidate nor a reason to refuse: the key cannot see it.
- a caller without namespaces (access control off, or an unscoped admin key) looks in the gateway's
  serving namespaces; a name several of them hold is refused as ambiguous, never given to the first.

Ambiguity is a 400 the caller fixes by writing `namespace/name`; it is never resolved by order, so a
new object can make a plain name fail loudly but never silently re-point its traffic (prompts included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from servlane_core.protocol.errors import OpenAIError, model_not_found
from servlane_core.routing.routes import Route, RouteTable

MayCall = Callable[[Route], bool]


def _anyone(_: Route) -> bool:
    return True


def ambiguous_model(requested: str, candidates: Sequence[str]) -> OpenAIError:
    """400 naming the `namespace/name` candidates (only ones the caller may call: nothing leaks)."""
    listed = ", ".join(f"'{c}'" for c in candidates)
    return OpenAIError(
        400,
        f"The model '{requested}' is ambiguous: it exists as {listed}. Ask for one of those by its full name.",
        param="model",
        code="ambiguous_model",
    )


def _candidates(table: RouteTable, name: str, namespaces: Sequence[str], may_call: MayCall) -> list[Route]:
    """The routes a plain `name` could mean for this caller, in the order of `namespaces` (or the serving
    namespaces' when the caller has none)."""
    search = namespaces or table.serving_namespaces
    found = (table.routes.get(f"{ns}/{name}") for ns in dict.fromkeys(search))
    return [route for route in found if route is not None and may_call(route)]


def resolve_name(
    table: RouteTable, requested: str, namespaces: Sequence[str] = (), may_call: MayCall = _anyone
) -> Route:
    """The route a request for `requested` goes to, for a caller whose key names `namespaces` (empty: the
    serving namespaces) and may call the routes `may_call` accepts. OpenAIError: 404 model_not_found,
    400 ambiguous_model. `namespace/name` is not filtered here: authorisation answers it (with a 404)."""
    if "/" in requested:
        route = table.routes.get(requested)
        if route is None:
            raise model_not_found(requested)
        return route
    candidates = _candidates(table, requested, namespaces, may_call)
    if not candidates:
        raise model_not_found(requested)
    if len(candidates) > 1:
        raise ambiguous_model(requested, [f"{r.namespace}/{r.name}" for r in candidates])
    return candidates[0]


def visible_names(
    table: RouteTable, namespaces: Sequence[str] = (), may_call: MayCall = _anyone
) -> list[tuple[str, Route]]:
    """What /v1/models lists for this caller: each route it may call once, by its plain name when
    resolve_name gives that route for the plain name, else as `namespace/name`; plain names first."""
    plain: list[tuple[str, Route]] = []
    qualified: list[tuple[str, Route]] = []
    for full, route in table.routes.items():
        if not may_call(route):
            continue
        candidates = _candidates(table, route.name, namespaces, may_call)
        if len(candidates) == 1 and candidates[0] is route:
            plain.append((route.name, route))
        else:
            qualified.append((full, route))
    return sorted(plain, key=_by_name) + sorted(qualified, key=_by_name)


def _by_name(named: tuple[str, Route]) -> str:
    return named[0]
