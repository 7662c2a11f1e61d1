"""The chart's alerts, run by promtool against synthetic series, and the dashboard, checked against the
metrics contracts (gateway: servlane_api.metric_names, operator: servlane_operator.operator_metrics,
kube-state-metrics config)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servlane_api import metric_names as contract
from tests.support.helmtool import CHART, MONITORING_API, Helm, one

DASHBOARD = CHART / "dashboards" / "servlane.json"
KSM_CONFIG = CHART / "files" / "kube-state-metrics-crs.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is required in CI (Debian package prometheus)")
        pytest.skip("promtool missing: apt-get install prometheus")
    return found


def operator_metric_names() -> set[str]:
    text = (CHART.parents[1] / "operator" / "servlane_operator" / "operator_metrics.py").read_text()
    return set(re.findall(r'"(servlane_operator_[a-z_]+)"', text))


def ksm_metric_names() -> set[str]:
    config = yaml.safe_load(KSM_CONFIG.read_text())
    return {f"{r['metricNamePrefix']}_{m['name']}" for r in config["spec"]["resources"] for m in r["metrics"]}


def known_series() -> set[str]:
    gateway = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
    histograms = {
        contract.LATENCY,
        contract.TTFT,
        contract.ADDED_LATENCY,
        "servlane_operator_reconcile_duration_seconds",
    }
    suffixed = {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}
    return gateway | suffixed | operator_metric_names() | ksm_metric_names()


def referenced_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(servlane_[a-z_]+)", expr))


def rules(helm: Helm, *sets: str) -> list[dict[str, Any]]:
    objects = helm.template(
        set_values=("monitoring.prometheusRule.enabled=true", *sets), api_versions=(MONITORING_API,)
    )
    return list(one(objects, "PrometheusRule")["spec"]["groups"])


def test_alert_expressions_use_only_contract_metrics(helm: Helm) -> None:
    names = known_series()
    for group in rules(helm):
        for rule in group["rules"]:
            used = referenced_metrics(rule["expr"])
            assert used, rule["alert"]
            assert used <= names, f"{rule['alert']} uses unknown metrics {used - names}"


def test_rules_pass_promtool_check(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules(helm)}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_fire_on_rollback_not_ready_error_spike_and_stalled_canaries_only(helm: Helm, tmp_path: Path) -> None:
    groups = rules(helm, "monitoring.prometheusRule.notReadyFor=15m")
    for group in groups:  # expressions and labels are under test here; annotations are templated text
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    series = [
        # chat: 100 requests/min, 20 of them failing -> 20 % errors.
        ('servlane_gateway_requests_total{namespace="t",feature="chat",model="a",code="200"}', "0+80x30"),
        ('servlane_gateway_requests_total{namespace="t",feature="chat",model="a",code="503"}', "0+20x30"),
        (
            'servlane_gateway_request_errors_total{namespace="t",feature="chat",model="a",reason="status_5xx"}',
            "0+20x30",
        ),
        # search: healthy; rare: every request fails, but far below the minimum request rate.
        ('servlane_gateway_requests_total{feature="search",model="b",code="200"}', "0+100x30"),
        ('servlane_gateway_request_errors_total{feature="search",model="b",reason="status_5xx"}', "0x30"),
        ('servlane_gateway_requests_total{feature="rare",model="c",code="503"}', "0+1x30"),
        ('servlane_gateway_request_errors_total{feature="rare",model="c",reason="status_5xx"}', "0+1x30"),
        ('servlane_aifeature_status_phase{namespace="t",name="chat",phase="RolledBack"}', "0x4 1x25"),
        ('servlane_aifeature_status_phase{namespace="t",name="search",phase="RolledBack"}', "0x30"),
        ('servlane_aimodel_status_phase{namespace="t",name="stuck",phase="Ready"}', "0x30"),
        ('servlane_aimodel_status_phase{namespace="t",name="fine",phase="Ready"}', "1x30"),
        ('servlane_aimodel_status_phase{namespace="t",name="late",phase="Ready"}', "0x9 1x20"),
        # idle: at rest at zero replicas the whole time (phase Pending, ScaledToZero=True): not an alert.
        ('servlane_aimodel_status_phase{namespace="t",name="idle",phase="Ready"}', "0x30"),
        ('servlane_aimodel_status_condition{namespace="t",name="idle",type="ScaledToZero"}', "1x30"),
        ('servlane_aimodel_status_condition{namespace="t",name="stuck",type="ScaledToZero"}', "0x30"),
        ('servlane_operator_model_phase{namespace="t",name="broken",phase="Failed"}', "1x30"),
        ('servlane_operator_model_phase{namespace="t",name="broken",phase="Ready"}', "0x30"),
        ('servlane_operator_model_phase{namespace="t",name="fine",phase="Ready"}', "1x30"),
        ('servlane_operator_reconciles_total{kind="AIModel",trigger="change",result="ok"}', "0+5x30"),
        # chat's rollout ran into its progress deadline at 10m; search's never did.
        (
            'servlane_operator_feature_progress_deadline_exceeded_total{namespace="t",feature="chat",action="Rollback"}',
            "0x9 1x20",
        ),
        (
            'servlane_operator_feature_progress_deadline_exceeded_total{namespace="t",feature="search",action="Pause"}',
            "0x30",
        ),
        # chat's canary metrics fail at every analysis; search's read fine.
        ('servlane_operator_canary_metrics_unavailable_total{namespace="t",feature="chat"}', "0+6x30"),
        ('servlane_operator_canary_metrics_unavailable_total{namespace="t",feature="search"}', "0x30"),
    ]
    alerts = {
        "ServlaneFeatureErrorRateHigh": [{"exp_labels": {"severity": "critical", "namespace": "t", "feature": "chat"}}],
        "ServlaneCanaryRolledBack": [{"exp_labels": {"severity": "warning", "namespace": "t", "name": "chat"}}],
        "ServlaneModelNotReady": [{"exp_labels": {"severity": "warning", "namespace": "t", "name": "stuck"}}],
        "ServlaneModelsFailing": [{"exp_labels": {"severity": "warning", "phase": "Failed"}}],
        "ServlaneReconcileErrors": [],
        "ServlaneCanaryProgressDeadlineExceeded": [
            {"exp_labels": {"severity": "warning", "namespace": "t", "feature": "chat", "action": "Rollback"}}
        ],
        "ServlaneCanaryMetricsUnavailable": [
            {"exp_labels": {"severity": "warning", "namespace": "t", "feature": "chat"}}
        ],
    }
    test_file = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [{"eval_time": "25m", "alertname": a, "exp_alerts": e} for a, e in alerts.items()],
            },
            {  # before `for:` has passed, nothing that needs it fires yet
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": a, "exp_alerts": []}
                    for a in (
                        "ServlaneFeatureErrorRateHigh",
                        "ServlaneModelNotReady",
                        "ServlaneCanaryRolledBack",
                        "ServlaneCanaryProgressDeadlineExceeded",
                        "ServlaneCanaryMetricsUnavailable",
                    )
                ],
            },
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(test_file))
    result = subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kube_state_metrics_alerts_can_be_turned_off(helm: Helm) -> None:
    alerts = {r["alert"] for g in rules(helm, "monitoring.prometheusRule.kubeStateMetrics=false") for r in g["rules"]}
    assert "ServlaneCanaryRolledBack" not in alerts
    assert "ServlaneFeatureErrorRateHigh" in alerts


def test_kube_state_metrics_config_lists_every_api_phase() -> None:
    from typing import get_args

    from servlane_api.aifeature import FeaturePhase

    config = yaml.safe_load(KSM_CONFIG.read_text())
    by_kind = {r["groupVersionKind"]["kind"]: r for r in config["spec"]["resources"]}
    phases = by_kind["AIFeature"]["metrics"][0]["each"]["stateSet"]["list"]
    assert phases == list(get_args(FeaturePhase))
    assert by_kind["AIModel"]["metrics"][0]["each"]["stateSet"]["list"] == [
        "Pending",
        "Deploying",
        "Ready",
        "Degraded",
        "Failed",
    ]


def dashboard_targets() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_use_only_contract_metrics() -> None:
    names = known_series()
    targets = dashboard_targets()
    assert len(targets) >= 15
    for title, expr in targets:
        used = referenced_metrics(expr)
        assert used, title
        assert used <= names, f"panel {title!r} uses unknown metrics {used - names}"


def test_dashboard_covers_requests_errors_latency_ttft_tokens_and_weights() -> None:
    used = set().union(*(referenced_metrics(e) for _, e in dashboard_targets()))
    needed = {contract.REQUESTS, contract.ERRORS, contract.TOKENS, contract.WEIGHT}
    needed |= {f"{contract.LATENCY}_bucket", f"{contract.TTFT}_bucket"}
    assert needed <= used
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "feature", "model"} <= variables
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
