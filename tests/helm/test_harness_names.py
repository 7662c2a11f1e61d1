"""The e2e harness shares one cluster between modules, some of which `helm install` the chart: nothing the harness
creates may take a name a release of the chart takes, or Helm refuses to adopt it and the install fails (a
rehearsal failed so once the Argo CD module, which starts an operator process, came to run before the chart's)."""

from __future__ import annotations

from tests.support.cluster_harness import OPERATOR_NS, OPERATOR_ROLE, OPERATOR_SA
from tests.support.helm_toggles import RELEASE as TOGGLES_RELEASE
from tests.support.helmtool import Helm

HARNESS_OBJECTS = {
    ("ServiceAccount", OPERATOR_NS, OPERATOR_SA),
    ("ClusterRole", None, OPERATOR_ROLE),
    ("ClusterRoleBinding", None, OPERATOR_ROLE),
}
RELEASES = ("servlane", TOGGLES_RELEASE, "mp")  # e2e/test_real_helm.py's, the toggles', the chart tests' own


def test_no_harness_object_takes_a_name_of_the_charts(helm: Helm) -> None:
    for release in RELEASES:
        rendered = {
            (o["kind"], o["metadata"].get("namespace", OPERATOR_NS) if o["kind"] == "ServiceAccount" else None,
             o["metadata"]["name"])
            for o in helm.template(release=release, namespace=OPERATOR_NS)
        }  # fmt: skip
        accounts = {name for kind, _, name in rendered if kind == "ServiceAccount"}
        assert any(name.endswith("-operator") for name in accounts), accounts  # the chart's own is in the set
        assert not HARNESS_OBJECTS & rendered, release
