"""status.coldStart in the AIModel's status, and the probe that turns a loaded runtime into a Ready pod (#30
items 3 and 4)."""

from __future__ import annotations

import kopf
import pytest

from servlane_api.aimodel import AIModelStatus
from servlane_api.crdgen import all_crds
from servlane_api.runtime_config import RuntimeConfig
from servlane_core.cold_start import breakdown, record_start
from servlane_operator import aimodel_reconciler
from servlane_operator.builders.deployment import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model
from tests.support.cold_start import STARTUP, pod, pulled
from tests.unit.fake_kube import FakeKube


def test_status_round_trips_through_the_aimodel_status() -> None:
    status = record_start(None, breakdown(pod(), [pulled(2)], STARTUP))  # type: ignore[arg-type]
    wire = AIModelStatus(cold_start=status).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["coldStart"]["last"]["podReady"] == 4.5
    assert AIModelStatus.model_validate(wire).cold_start == status


def test_a_loaded_runtime_waits_at_most_a_second_for_the_startup_probe(settings: OperatorSettings) -> None:
    """The startup probe's period is time any cold start may lose between the runtime's ready and the pod's
    Ready (#30 item 4: it was 10 s); the probe still allows the runtime's whole load timeout."""
    spec = {"source": {"uri": "/models/tiny"}, "engine": "transformers"}
    (container,) = build_deployment(make_model(spec), settings)["spec"]["template"]["spec"]["containers"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] <= 1
    assert startup.get("initialDelaySeconds", 0) == 0
    load_timeout = RuntimeConfig.model_fields["load_timeout_seconds"].default
    assert startup["periodSeconds"] * startup["failureThreshold"] >= load_timeout


def test_kubectl_get_wide_shows_the_last_cold_start_from_where_status_keeps_it() -> None:
    columns = all_crds()["aimodels.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]
    column = next(c for c in columns if c["name"] == "Cold start")
    assert (column["type"], column.get("priority")) == ("number", 1)
    status = record_start(None, breakdown(pod(), [pulled(2)], STARTUP))  # type: ignore[arg-type]
    node: object = {"status": AIModelStatus(cold_start=status).model_dump(by_alias=True, mode="json")}
    for key in column["jsonPath"].strip(".").split("."):
        assert isinstance(node, dict), column
        node = node[key]
    assert node == 14.0


async def test_the_reconcilers_status_writes_never_clear_the_cold_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """status.coldStart has one writer (cold_start_reader): a reconcile or a refresh, whose status has no cold
    start of its own, must leave it out of its merge patch (a null there would delete it)."""
    cold = record_start(None, breakdown(pod(), [pulled(2)], STARTUP))  # type: ignore[arg-type]
    spec = {"source": {"uri": "/models/tiny"}, "engine": "transformers"}
    stored = cold.model_dump(by_alias=True, mode="json")
    body = make_model(spec, coldStart=stored).model_dump(by_alias=True, mode="json")
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)  # kopf posts Events from a running operator only
    kube = FakeKube()
    settings = OperatorSettings(gateway_namespace="servlane-system")
    await aimodel_reconciler.reconcile(body, kube, settings, [], trigger="change")
    await aimodel_reconciler.refresh_status(body, kube, settings, None, [])
    assert len(kube.statuses) == 2
    assert all("coldStart" not in written for written in kube.statuses), kube.statuses
