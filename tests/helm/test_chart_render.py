"""`helm lint` and `helm template` of charts/servlane over the defaults and every ci/*-values.yaml scenario,
with assertions on what is rendered: labels, RBAC, probes, security contexts, peering, monitors, schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import containers, env_of
from tests.support.helmtool import CHART, MONITORING_API, ROOT, Helm, find, one

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RULES = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
WORKLOADS = ("mp-servlane-operator", "mp-servlane-gateway")


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Rules flattened to (group, resource, verb) triples, so equal grants compare equal however grouped."""
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_lint_passes_for_every_ci_scenario(helm: Helm, values: Path) -> None:
    result = helm.run("lint", str(CHART), "--strict", "--values", str(values))
    assert "0 chart(s) failed" in result.stdout


def test_ci_scenarios_cover_the_optional_features() -> None:
    names = {p.name for p in CI_VALUES}
    assert {"default-values.yaml", "ha-values.yaml", "namespaced-values.yaml", "monitoring-values.yaml"} <= names


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_object_has_the_recommended_labels_and_stable_selectors(helm: Helm, values: Path) -> None:
    objects = helm.template(values, api_versions=(MONITORING_API,))
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "servlane", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "mp"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "servlane"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
    for dep in find(objects, "Deployment"):
        selector = dep["spec"]["selector"]["matchLabels"]
        assert not {"app.kubernetes.io/version", "helm.sh/chart"} & selector.keys()
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()


def test_default_install_renders_operator_and_gateway_with_their_service_accounts(helm: Helm) -> None:
    objects = helm.template()
    operator, gateway = (one(objects, "Deployment", name) for name in WORKLOADS)
    assert operator["spec"]["template"]["spec"]["serviceAccountName"] == "mp-servlane-operator"
    assert gateway["spec"]["template"]["spec"]["serviceAccountName"] == "mp-servlane-gateway"
    assert {sa["metadata"]["name"] for sa in find(objects, "ServiceAccount")} == set(WORKLOADS)
    assert containers(operator)[0]["image"] == "ghcr.io/servlane/operator:0.1.0"
    assert containers(operator)[0]["command"] == ["python", "-m", "servlane_operator"]
    assert containers(gateway)[0]["image"] == "ghcr.io/servlane/gateway:0.1.0"  # its own image, not the runtime's
    assert containers(gateway)[0]["command"] == ["python", "-m", "servlane_gateway"]
    assert containers(gateway)[0]["args"] == ["--watch"]
    assert operator["spec"]["strategy"]["type"] == "Recreate"  # never two standalone operators at once
    # The operator finds the gateway pods by these labels (servlane_operator.labels.GATEWAY_SELECTOR).
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/component"] == "gateway"
    assert pod_labels["app.kubernetes.io/part-of"] == "servlane"
    service = one(objects, "Service", "mp-servlane-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == gateway["spec"]["selector"]["matchLabels"]
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert not find(objects, "HorizontalPodAutoscaler")
    assert not find(objects, "Secret")


def test_runtime_images_default_to_the_app_version_variants(helm: Helm) -> None:
    env = env_of(one(helm.template(), "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_RUNTIME_IMAGE_GPU"] == "ghcr.io/servlane/runtime:0.1.0-cuda"
    assert env["SERVLANE_RUNTIME_IMAGE_CPU"] == "ghcr.io/servlane/runtime:0.1.0-cpu"
    assert "SERVLANE_RUNTIME_IMAGE" not in env  # the operator refuses to start with the removed variable


@pytest.mark.parametrize(
    ("set_values", "gpu", "cpu"),
    [
        (
            ("operator.runtimeImages.gpu.repository=registry.local/rt-cuda", "operator.runtimeImages.gpu.tag=9.9"),
            "registry.local/rt-cuda:9.9",
            "ghcr.io/servlane/runtime:0.1.0-cpu",
        ),
        (
            ("operator.runtimeImages.cpu.repository=registry.local/rt-cpu", "operator.runtimeImages.cpu.tag=9.9"),
            "ghcr.io/servlane/runtime:0.1.0-cuda",
            "registry.local/rt-cpu:9.9",
        ),
        (
            (
                "operator.runtimeImages.gpu.repository=mirror/runtime",
                "operator.runtimeImages.cpu.repository=mirror/runtime",
            ),
            "mirror/runtime:0.1.0-cuda",
            "mirror/runtime:0.1.0-cpu",
        ),
    ],
    ids=["gpu", "cpu", "repositories-only"],
)
def test_each_runtime_image_can_be_overridden(helm: Helm, set_values: tuple[str, ...], gpu: str, cpu: str) -> None:
    env = env_of(one(helm.template(set_values=set_values), "Deployment", "mp-servlane-operator"))
    assert (env["SERVLANE_RUNTIME_IMAGE_GPU"], env["SERVLANE_RUNTIME_IMAGE_CPU"]) == (gpu, cpu)


def test_gateway_image_can_be_overridden(helm: Helm) -> None:
    objects = helm.template(set_values=("gateway.image.repository=registry.local/gw", "gateway.image.tag=9.9"))
    assert containers(one(objects, "Deployment", "mp-servlane-gateway"))[0]["image"] == "registry.local/gw:9.9"


def test_operator_settings_come_from_values(helm: Helm) -> None:
    objects = helm.template(
        set_values=(
            "operator.prometheusUrl=http://prom:9090",
            "operator.resyncSeconds=30",
            "operator.maxConcurrentReconciles=4",
            "operator.watchNamespaces={a,b}",
        )
    )
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_PROMETHEUS_URL"] == "http://prom:9090"
    assert env["SERVLANE_RESYNC_SECONDS"] == "30"
    assert env["SERVLANE_MAX_CONCURRENT_RECONCILES"] == "4"
    assert env["SERVLANE_NAMESPACES"] == "a,b"
    assert env["SERVLANE_METRICS_PORT"] == "9090"
    assert env_of(one(objects, "Deployment", "mp-servlane-gateway"))["SERVLANE_GATEWAY_NAMESPACES"] == "a,b"


def test_cluster_wide_operator_gets_exactly_the_rules_file(helm: Helm) -> None:
    objects = helm.template()
    role = one(objects, "ClusterRole", "mp-servlane-operator")
    assert role["rules"] == RULES
    binding = one(objects, "ClusterRoleBinding", "mp-servlane-operator")
    assert binding["roleRef"]["name"] == "mp-servlane-operator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mp-servlane-operator", "namespace": "servlane-system"}
    ]
    assert not find(objects, "Role")


def test_namespaced_operator_gets_the_rules_split_into_roles(helm: Helm) -> None:
    objects = helm.template(CHART / "ci" / "namespaced-values.yaml")
    cluster = rule_set(one(objects, "ClusterRole", "mp-servlane-operator")["rules"])
    # Only what is cluster-scoped stays cluster-wide (Prometheus is set, so no cluster-wide pod reads).
    assert {r for _, r, _ in cluster} == {"customresourcedefinitions", "namespaces"}
    roles = [r for r in find(objects, "Role") if r["metadata"]["name"] == "mp-servlane-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    peering = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
    for role in roles:
        assert cluster | rule_set(role["rules"]) == rule_set(RULES) | peering
    bindings = [b for b in find(objects, "RoleBinding") if b["metadata"]["name"] == "mp-servlane-operator"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]


def test_namespaced_operator_without_prometheus_may_read_pods_cluster_wide(helm: Helm) -> None:
    # The canary analysis then scrapes the gateway pods, which it finds with a cluster-wide pod list.
    objects = helm.template(set_values=("operator.watchNamespaces={team-a}",))
    cluster = rule_set(one(objects, "ClusterRole", "mp-servlane-operator")["rules"])
    assert ("", "pods", "list") in cluster
    assert ("apps", "deployments", "create") not in cluster


def test_gateway_rbac_reads_routing_and_writes_only_leases(helm: Helm) -> None:
    """Read-only but for the demand Leases of the models it holds requests for (routing.demand_lease)."""
    for objects, kind in (
        (helm.template(), "ClusterRole"),
        (helm.template(CHART / "ci/namespaced-values.yaml"), "Role"),
    ):
        roles = [r for r in find(objects, kind) if r["metadata"]["name"] == "mp-servlane-gateway"]
        assert roles
        for role in roles:
            assert rule_set(role["rules"]) == {
                ("servlane.dev", res, verb) for res in ("aifeatures", "aimodels") for verb in ("get", "list", "watch")
            } | {("discovery.k8s.io", "endpointslices", verb) for verb in ("list", "watch")} | {
                ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "patch")
            }


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_pods_run_as_non_root_with_a_read_only_root_filesystem_and_probes(helm: Helm, values: Path) -> None:
    objects = helm.template(values)
    for dep in find(objects, "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert container["livenessProbe"]["httpGet"]["path"] in ("/healthz", "/health")
            assert "readinessProbe" in container
            port_names = {p["name"] for p in container["ports"]}
            assert container["livenessProbe"]["httpGet"]["port"] in port_names
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    if values.name == "default-values.yaml":
        assert all("resources" not in c for d in find(objects, "Deployment") for c in containers(d))


def test_gateway_probes_use_health_and_ready(helm: Helm) -> None:
    container = containers(one(helm.template(), "Deployment", "mp-servlane-gateway"))[0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}


def test_peering_objects_and_rbac_only_with_more_than_one_replica(helm: Helm) -> None:
    single = helm.template()
    assert not find(single, "ClusterKopfPeering")
    assert not find(single, "KopfPeering")
    assert "--peering" not in containers(one(single, "Deployment", "mp-servlane-operator"))[0]["args"]
    assert not any(r[0] == "kopf.dev" for r in rule_set(one(single, "ClusterRole", "mp-servlane-operator")["rules"]))

    ha = helm.template(CHART / "ci" / "ha-values.yaml")
    peering = one(ha, "ClusterKopfPeering")
    operator = one(ha, "Deployment", "mp-servlane-operator")
    args = containers(operator)[0]["args"]
    assert args[args.index("--peering") + 1] == peering["metadata"]["name"]
    assert operator["spec"]["strategy"]["type"] == "RollingUpdate"
    grants = rule_set(one(ha, "ClusterRole", "mp-servlane-operator")["rules"])
    assert {("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")} <= grants

    namespaced = helm.template(CHART / "ci" / "namespaced-values.yaml")
    assert not find(namespaced, "ClusterKopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in find(namespaced, "KopfPeering")) == ["team-a", "team-b"]


def test_autoscaled_gateway_leaves_replicas_to_the_hpa(helm: Helm) -> None:
    objects = helm.template(CHART / "ci" / "ha-values.yaml")
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "mp-servlane-gateway"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert "replicas" not in one(objects, "Deployment", "mp-servlane-gateway")["spec"]


def test_hpa_without_cpu_requests_fails_with_a_clear_message(helm: Helm) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", "gateway.autoscaling.enabled=true", check=False)
    assert result.returncode != 0
    assert "gateway.autoscaling.enabled needs gateway.resources.requests.cpu" in result.stderr


def test_monitors_and_rules_only_when_the_prometheus_operator_api_exists(helm: Helm) -> None:
    values = CHART / "ci" / "monitoring-values.yaml"
    without = helm.template(values)
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {o["kind"] for o in without}
    assert one(without, "ConfigMap")["metadata"]["labels"]["grafana_dashboard"] == "1"

    objects = helm.template(values, api_versions=(MONITORING_API,))
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    gateway = one(objects, "Service", "mp-servlane-gateway-metrics")  # /metrics has a port and Service of its own
    assert monitor["spec"]["selector"]["matchLabels"].items() <= gateway["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    pod_monitor = one(objects, "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    rule = one(objects, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"ServlaneCanaryRolledBack", "ServlaneModelNotReady", "ServlaneFeatureErrorRateHigh"} <= alerts

    disabled = helm.template(api_versions=(MONITORING_API,))
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} & {o["kind"] for o in disabled}


def test_dashboard_configmap_holds_the_dashboard_file(helm: Helm) -> None:
    objects = helm.template(CHART / "ci" / "monitoring-values.yaml")
    data = one(objects, "ConfigMap")["data"]["servlane.json"]
    assert data == (CHART / "dashboards" / "servlane.json").read_text().rstrip("\n")


def test_api_keys_secret_is_mounted_as_a_folder_for_rotation(helm: Helm) -> None:
    objects = helm.template(CHART / "ci" / "secured-values.yaml")
    secret = one(objects, "Secret")
    lines = [line for line in secret["stringData"]["keys"].splitlines() if not line.startswith("#")]
    assert lines == [
        "team-a: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "team-b: sha256:cda48a6e3aee0ac6e55ccf662fb0ead50a8c7b0f5d233ddff2c5885b70b4bce5 team-b/chat,team-b/summarise",
    ]
    gateway = one(objects, "Deployment", "mp-servlane-gateway")
    assert env_of(gateway)["SERVLANE_GATEWAY_KEYS_FILE"] == "/etc/servlane/api-keys/keys"
    mount = next(m for m in containers(gateway)[0]["volumeMounts"] if m["name"] == "api-keys")
    assert "subPath" not in mount
    volume = next(v for v in gateway["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]

    existing = helm.template(set_values=("gateway.apiKeys.existingSecret=my-keys",))
    assert not find(existing, "Secret")
    assert env_of(one(existing, "Deployment", "mp-servlane-gateway"))["SERVLANE_GATEWAY_KEYS_FILE"]


def test_rendered_keys_file_is_what_the_gateway_parses_and_holds_only_digests(helm: Helm) -> None:
    from servlane_gateway.access import KeyRing, parse_keys

    objects = helm.template(CHART / "ci" / "secured-values.yaml")
    text = one(objects, "Secret")["stringData"]["keys"]
    keys = KeyRing(parse_keys(text))
    assert [k.name for k in keys.keys] == ["team-a", "team-b"]
    assert keys.authenticate("Bearer sk-team-b-example").name == "team-b"  # type: ignore[union-attr]
    assert "sk-team-b-example" not in text


@pytest.mark.parametrize(
    "key",
    [
        "sk-team-a-plaintext",  # a plaintext key would sit in values and in Helm's release history
        "sha256:abcd",  # too short
        "sha256:" + "g" * 64,  # not hex
        "sha256:" + "a" * 64 + " extra",
    ],
)
def test_schema_refuses_api_keys_that_are_not_sha256_digests(helm: Helm, key: str) -> None:
    settings = (
        "--set",
        "gateway.apiKeys.entries[0].name=team-a",
        "--set-string",
        f"gateway.apiKeys.entries[0].key={key}",
    )
    result = helm.run("template", "mp", str(CHART), *settings, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert "at '/gateway/apiKeys/entries/0/key'" in result.stderr
    assert key.split()[0] not in result.stdout


@pytest.mark.parametrize(
    ("set_values", "serving"),
    [
        ((), "servlane-system"),  # watching every namespace: only the gateway's own
        (("operator.watchNamespaces={prod,staging}",), "prod,staging"),
        (("gateway.watchNamespaces={b,a}",), "b,a"),
        (("gateway.watchNamespaces={a,b}", "gateway.servingNamespaces={b}"), "b"),
    ],
)
def test_gateway_serving_namespaces_are_never_every_namespace(
    helm: Helm, set_values: tuple[str, ...], serving: str
) -> None:
    env = env_of(one(helm.template(set_values=set_values), "Deployment", "mp-servlane-gateway"))
    assert env["SERVLANE_GATEWAY_SERVING_NAMESPACES"] == serving


def test_network_policies_admit_the_operator_to_the_gateway(helm: Helm) -> None:
    objects = helm.template(CHART / "ci" / "secured-values.yaml")
    policy = one(objects, "NetworkPolicy", "mp-servlane-gateway")
    api, metrics = (rule["from"] for rule in policy["spec"]["ingress"])
    operator = one(objects, "Deployment", "mp-servlane-operator")
    # The operator scrapes the gateway's metrics port (canary analysis without Prometheus); it needs no API.
    assert {"podSelector": {"matchLabels": operator["spec"]["selector"]["matchLabels"]}} in metrics
    assert {"namespaceSelector": {"matchLabels": {"servlane.dev/clients": "true"}}} in api
    assert {"podSelector": {"matchLabels": operator["spec"]["selector"]["matchLabels"]}} not in api
    assert one(objects, "NetworkPolicy", "mp-servlane-operator")
    assert not find(helm.template(), "NetworkPolicy")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("operator.replicaCont=2", "additional properties 'replicaCont' not allowed"),
        ("operator.logFormat=xml", "at '/operator/logFormat': value must be one of 'json', 'plain'"),
        ("gateway.service.type=Ingress", "at '/gateway/service/type'"),
        ("operator.replicaCount=0", "at '/operator/replicaCount'"),
        ("operator.watchNamespaces={Bad_NS}", "at '/operator/watchNamespaces/0'"),
        ("monitoring.prometheusRule.notReadyFor=soon", "at '/monitoring/prometheusRule/notReadyFor'"),
        ("gateway.autoscaling.enabeld=true", "additional properties 'enabeld' not allowed"),
        # The single runtime image of before: two per-variant images replaced it.
        ("operator.runtimeImage.tag=1", "additional properties 'runtimeImage' not allowed"),
        ("operator.runtimeImages.gpu.image=x", "additional properties 'image' not allowed"),
    ],
)
def test_schema_rejects_bad_values_with_a_clear_message(helm: Helm, setting: str, message: str) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_schema_describes_every_value() -> None:
    import json

    def walk(schema: dict[str, Any], path: str) -> list[str]:
        missing = [] if "description" in schema or path == "" else [path]
        for name, sub in schema.get("properties", {}).items():
            missing += walk(sub, f"{path}.{name}")
        items = schema.get("items")
        if isinstance(items, dict):  # list items need no description of their own, their fields do
            missing += [m for m in walk({**items, "description": "-"}, f"{path}[]")]
        return missing

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert walk(schema, "") == []


def test_chart_crds_are_the_generated_crds() -> None:
    generated = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    in_chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert generated, "crds/ is empty"
    for name, content in generated.items():
        assert in_chart.get(name) == content, f"charts/servlane/crds/{name} differs: run `make chart-crds`"
    # The one addition: kopf's peering CRDs, which the peering objects of a multi-replica operator need.
    assert set(in_chart) - set(generated) == {"kopf-peering.yaml"}


SCRAPER = "operator.modelNetworkPolicy.metricsScraper"
SCRAPER_VARS = ("SERVLANE_METRICS_SCRAPER_NAMESPACE", "SERVLANE_METRICS_SCRAPER_LABELS")


def test_model_network_policies_are_on_by_default_and_admit_no_scraper(helm: Helm) -> None:
    env = env_of(one(helm.template(), "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_MODEL_NETWORK_POLICY"] == "true"
    assert env["SERVLANE_GATEWAY_NAMESPACE"] == "servlane-system"  # the gateway pods the policies admit
    assert not set(SCRAPER_VARS) & env.keys()


def test_the_metrics_scraper_is_passed_to_the_operator_as_it_parses_it(helm: Helm) -> None:
    from servlane_operator.settings import OperatorSettings

    objects = helm.template(
        set_values=(
            f"{SCRAPER}.namespace=monitoring",
            f"{SCRAPER}.podLabels.zeta=z",
            f"{SCRAPER}.podLabels.app\\.kubernetes\\.io/name=prometheus",
        )
    )
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_MODEL_NETWORK_POLICY"] == "true"
    assert env["SERVLANE_METRICS_SCRAPER_NAMESPACE"] == "monitoring"
    assert env["SERVLANE_METRICS_SCRAPER_LABELS"] == "app.kubernetes.io/name=prometheus,zeta=z"  # sorted by key
    settings = OperatorSettings.from_env(env)
    assert settings.model_network_policy is True
    assert settings.metrics_scraper_namespace == "monitoring"
    assert settings.metrics_scraper_labels == {"app.kubernetes.io/name": "prometheus", "zeta": "z"}


def test_a_scraper_namespace_without_labels_renders_no_label_variable(helm: Helm) -> None:
    objects = helm.template(set_values=(f"{SCRAPER}.namespace=monitoring",))
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_METRICS_SCRAPER_NAMESPACE"] == "monitoring"
    assert "SERVLANE_METRICS_SCRAPER_LABELS" not in env


def test_model_network_policies_can_be_turned_off(helm: Helm) -> None:
    from servlane_operator.settings import OperatorSettings

    objects = helm.template(set_values=("operator.modelNetworkPolicy.enabled=false", f"{SCRAPER}.namespace=monitoring"))
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert env["SERVLANE_MODEL_NETWORK_POLICY"] == "false"
    assert not set(SCRAPER_VARS) & env.keys()  # nothing to admit a scraper to
    assert OperatorSettings.from_env(env).model_network_policy is False


def test_scraper_labels_without_a_namespace_fail_the_render(helm: Helm) -> None:
    # The operator admits a scraper only from a named namespace: labels alone would silently admit nothing.
    result = helm.run("template", "mp", str(CHART), "--set", f"{SCRAPER}.podLabels.app=prometheus", check=False)
    assert result.returncode != 0
    assert f"{SCRAPER}.podLabels needs metricsScraper.namespace" in result.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        # A comma or '=' would corrupt the k=v,k2=v2 encoding the operator parses.
        (f"{SCRAPER}.podLabels.app=a\\,b", "at '/operator/modelNetworkPolicy/metricsScraper/podLabels/app'"),
        (f"{SCRAPER}.podLabels.a\\=b=c", "invalid propertyName 'a=b'"),
        (f"{SCRAPER}.namespace=Monitoring", "at '/operator/modelNetworkPolicy/metricsScraper/namespace'"),
        ("operator.modelNetworkPolicy.enabled=yes", "at '/operator/modelNetworkPolicy/enabled'"),
        ("operator.modelNetworkPolicy.scraper.namespace=m", "additional properties 'scraper' not allowed"),
    ],
)
def test_schema_rejects_bad_model_network_policy_values(helm: Helm, setting: str, message: str) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_gateway_quota_settings_reach_the_gateway(helm: Helm) -> None:
    from servlane_gateway.flags import parse_settings

    defaults = env_of(one(helm.template(), "Deployment", "mp-servlane-gateway"))
    assert defaults["SERVLANE_GATEWAY_KEY_MAX_IN_FLIGHT"] == "0"  # unlimited unless set
    assert defaults["SERVLANE_GATEWAY_RESERVED_COMPLETION_TOKENS"] == "256"
    limits = ("gateway.rateLimits.keyMaxInFlight=4", "gateway.rateLimits.reservedCompletionTokens=512")
    env = env_of(one(helm.template(set_values=limits), "Deployment", "mp-servlane-gateway"))
    settings = parse_settings(["--watch"], env)
    assert (settings.key_max_in_flight, settings.reserved_completion_tokens) == (4, 512)
    result = helm.run("template", "mp", str(CHART), "--set", "gateway.rateLimits.keyMaxInFlight=-1", check=False)
    assert result.returncode != 0
    assert "at '/gateway/rateLimits/keyMaxInFlight'" in result.stderr


def test_gateway_client_deadlines_reach_the_gateway(helm: Helm) -> None:
    from servlane_gateway.flags import parse_settings

    defaults = parse_settings(["--watch"], env_of(one(helm.template(), "Deployment", "mp-servlane-gateway")))
    assert (defaults.client_head_timeout, defaults.client_body_timeout, defaults.client_read_stall_timeout) == (
        30,
        60,
        60,
    )
    deadlines = (
        "gateway.timeouts.clientHeadSeconds=10",
        "gateway.timeouts.clientBodyIdleSeconds=3",
        "gateway.timeouts.clientReadStallSeconds=7",
    )
    env = env_of(one(helm.template(set_values=deadlines), "Deployment", "mp-servlane-gateway"))
    settings = parse_settings(["--watch"], env)
    assert (settings.client_head_timeout, settings.client_body_timeout, settings.client_read_stall_timeout) == (
        10,
        3,
        7,
    )
    result = helm.run("template", "mp", str(CHART), "--set", "gateway.timeouts.clientHeadSeconds=0", check=False)
    assert result.returncode != 0
    assert "at '/gateway/timeouts/clientHeadSeconds'" in result.stderr


def test_gateway_redis_settings_reach_the_gateway_and_keep_the_password_in_secrets(helm: Helm) -> None:
    from servlane_gateway.flags import parse_settings

    assert not any(
        name.startswith("SERVLANE_GATEWAY_REDIS")
        for name in env_of(one(helm.template(), "Deployment", "mp-servlane-gateway"))
    )
    shared = (
        "gateway.rateLimits.redis.url=redis://redis.data:6379/0",
        "gateway.rateLimits.redis.passwordSecret.name=redis-auth",
        "gateway.rateLimits.redis.inFlightLeaseSeconds=20",
    )
    gateway = one(helm.template(set_values=shared), "Deployment", "mp-servlane-gateway")
    env = env_of(gateway)
    assert env["SERVLANE_GATEWAY_REDIS_URL"] == "redis://redis.data:6379/0"
    assert env["SERVLANE_GATEWAY_REDIS_KEY_PREFIX"] == "servlane:servlane-system:mp-servlane-gateway"
    password = next(e for e in containers(gateway)[0]["env"] if e["name"] == "SERVLANE_GATEWAY_REDIS_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "password"}
    settings = parse_settings(["--watch"], env)
    assert settings.redis_url is not None
    assert (settings.redis_in_flight_lease, settings.redis_timeout) == (20, 0.5)
    from_secret = one(
        helm.template(set_values=("gateway.rateLimits.redis.existingSecret=redis-url",)),
        "Deployment",
        "mp-servlane-gateway",
    )
    url = next(e for e in containers(from_secret)[0]["env"] if e["name"] == "SERVLANE_GATEWAY_REDIS_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "redis-url", "key": "url"}
    result = helm.run(
        "template", "mp", str(CHART), "--set", "gateway.rateLimits.redis.url=redis://:pw@r:6379", check=False
    )
    assert result.returncode != 0  # a password in values would sit in Helm's release history
    assert "at '/gateway/rateLimits/redis/url'" in result.stderr


def test_gateway_workers_reach_the_gateway_and_more_than_one_needs_shared_limits(helm: Helm) -> None:
    from servlane_gateway.flags import parse_settings

    defaults = env_of(one(helm.template(), "Deployment", "mp-servlane-gateway"))
    assert parse_settings(["--watch"], defaults).workers == 0  # one per CPU given
    four = env_of(one(helm.template(set_values=("gateway.workers=4",)), "Deployment", "mp-servlane-gateway"))
    assert parse_settings(["--watch"], four).workers == 4
    limited = ("gateway.workers=2", "gateway.rateLimits.keyRequestsPerMinute=60")
    result = helm.run("template", "mp", str(CHART), *(a for v in limited for a in ("--set", v)), check=False)
    assert result.returncode != 0
    assert "needs gateway.rateLimits.redis" in result.stderr
    shared = (*limited, "gateway.rateLimits.redis.url=redis://redis.data:6379/0")
    env = env_of(one(helm.template(set_values=shared), "Deployment", "mp-servlane-gateway"))
    assert parse_settings(["--watch"], env).workers == 2


def test_tracing_is_off_by_default_and_one_setting_turns_it_on_everywhere(helm: Helm) -> None:
    from servlane_operator.builders.deployment import tracing_env
    from servlane_operator.settings import OperatorSettings

    objects = helm.template()
    assert not [k for k in env_of(one(objects, "Deployment", "mp-servlane-gateway")) if k.startswith("OTEL_")]
    assert "SERVLANE_TRACING_OTLP_ENDPOINT" not in env_of(one(objects, "Deployment", "mp-servlane-operator"))

    endpoint = "http://otel-collector.observability:4318"
    objects = helm.template(
        set_values=("tracing.enabled=true", f"tracing.otlpEndpoint={endpoint}", "tracing.samplingRatio=0.25")
    )
    gateway = env_of(one(objects, "Deployment", "mp-servlane-gateway"))
    assert gateway["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    assert gateway["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert gateway["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    # The operator passes the same to every model pod, as it parses its variables.
    settings = OperatorSettings.from_env(env_of(one(objects, "Deployment", "mp-servlane-operator")))
    pods = tracing_env(settings)
    assert pods["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    assert pods["OTEL_TRACES_SAMPLER_ARG"] == "0.25"


def test_tracing_without_an_endpoint_fails_the_render(helm: Helm) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", "tracing.enabled=true", check=False)
    assert result.returncode != 0
    assert "otlpEndpoint" in result.stderr
