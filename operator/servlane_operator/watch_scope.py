"""What the operator asks the API server to send it: of the built-in kinds, only its own children.

A handler's `labels=` filter (`@kopf.index(..., labels=...)`, `@kopf.on.event(..., labels=...)`) is applied
by kopf in the operator, after it has listed and watched *every* object of that kind in the cluster: in a
cluster with thousands of unrelated pods, the operator would parse, hold during the listing and filter
each of them, and its memory and CPU would grow with everything else running there. kopf (>= 1.45) sends
`settings.watching.label_selectors` as `labelSelector` on its list and watch requests of the matching
resources (kopf/_cogs/clients/fetching.py and watching.py), so the API server filters instead. This is
kopf's public setting (documented on OperatorSettings.watching), not an adapter around kopf;
`restrict_watches` sets it from the startup handler, which kopf runs before any watch starts.

The selector is the label every child carries (labels.model_labels), applied with server-side apply under
our field manager, which takes it back if someone removes it; an object that stops matching reaches us as
a DELETED watch event, as it would leave the client-side filter. Our own custom resources (AIModel,
AIFeature) are not filtered: every one of them is ours to reconcile.

Namespaces: with `--namespace`/SERVLANE_NAMESPACES, main.py hands them to kopf.run, which then lists and
watches each kind per namespace (`/namespaces/<ns>/pods?...`) instead of cluster-wide.
"""

from __future__ import annotations

import kopf

from servlane_core.scaling.demand import DEMAND_LABELS
from servlane_operator.labels import MANAGED_BY, OPERATOR_NAME

# The handlers' client-side filter and the server-side selector are the same one label.
OWNED = {MANAGED_BY: OPERATOR_NAME}
OWNED_SELECTOR = ",".join(f"{key}={value}" for key, value in OWNED.items())

# (group, version, plural) of every built-in kind the handlers watch; handlers.py declares its watches
# with these, so a kind cannot be watched there without being listed here.
DEPLOYMENTS = ("apps", "v1", "deployments")
PODS = ("", "v1", "pods")
CHILD_KINDS = (DEPLOYMENTS, PODS)
# The gateway's demand Leases (servlane_core.scaling.demand), never the cluster's other Leases (one per node, and
# every controller's leader election).
LEASES = ("coordination.k8s.io", "v1", "leases")
DEMAND = DEMAND_LABELS
DEMAND_SELECTOR = ",".join(f"{key}={value}" for key, value in DEMAND.items())


def restrict_watches(settings: kopf.OperatorSettings) -> None:
    """Makes kopf list and watch the child kinds with the owned-label selector (call before watches start).

    Fails loudly on a kopf without server-side selectors rather than silently watching the whole cluster."""
    selectors = getattr(settings.watching, "label_selectors", None)
    if selectors is None:
        raise RuntimeError(
            "this kopf has no settings.watching.label_selectors (kopf >= 1.45 is required): "
            "without it the operator would list and watch every Pod and Deployment in the cluster"
        )
    for kind in CHILD_KINDS:
        selectors[kind] = OWNED_SELECTOR
    selectors[LEASES] = DEMAND_SELECTOR
