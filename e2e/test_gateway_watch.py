"""The gateway's routes come from the cluster: it watches AIFeature and AIModel objects through the real
API server and applies weight and readiness changes without a restart.

The operator is paused for this test so the test can write the statuses itself (KWOK pods cannot serve
HTTP). The gateway calls each AIModel at its own Service, `model-<name>.<namespace>.svc.cluster.local`,
whatever the status' endpoint says (that is only a readiness signal: anyone who may patch the status could
point it anywhere); nothing here resolves those names, so endpoint overrides map them onto real
OpenAI-speaking servers on loopback, as for a gateway run on a laptop.

The gateway watches the whole cluster, as the chart's default does; plain names resolve only in its serving
namespaces (here its own, `default`), so the test calls its feature by the `namespace/chat` alias, which no
other namespace can take.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.cluster_harness import ARTIFACTS, GROUP, VERSION, Kube, wait_until, watching_gateway
from tests.support.gateway_harness import ServedApp
from tests.support.gateway_upstream import create_upstream

pytestmark = pytest.mark.e2e


@pytest.fixture
def upstreams() -> Iterator[dict[str, str]]:
    with ServedApp(create_upstream("v1")[0]) as one, ServedApp(create_upstream("v2")[0]) as two:
        yield {"v1": one.url, "v2": two.url}


def service_url(ns: str, name: str) -> str:
    """The AIModel's own Service (servlane_api.children.service_base_url), as the operator names it."""
    return f"http://model-{name}.{ns}.svc.cluster.local:8000"


@pytest.fixture
def gateway(kube: Kube, paused_operator: None, namespace: str, upstreams: dict[str, str]) -> Iterator[str]:
    overrides = [f"--endpoint-override={service_url(namespace, name)}={url}" for name, url in upstreams.items()]
    with watching_gateway(kube, "gateway-watch.log", *overrides) as url:
        yield url


def set_model_status(kube: Kube, ns: str, name: str, ready: bool, endpoint: str | None = None) -> None:
    """The status as the operator writes it; `endpoint` instead of the AIModel's own Service URL."""
    status = {
        "endpoint": f"{endpoint or service_url(ns, name)}/v1",
        "servedModelName": name,
        # Not ready and not on its way: refused at once (a Deploying model's requests would wait for its pods).
        "phase": "Ready" if ready else "Degraded",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Test", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }  # fmt: skip
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "aimodels", name, {"status": status})


def set_weights(kube: Kube, ns: str, feature: str, weights: dict[str, int]) -> None:
    status = {"weights": [{"model": m, "weight": w} for m, w in weights.items()]}
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "aifeatures", feature, {"status": status})


def answered_by(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return str(reply.choices[0].message.content).split()[0]


def answered_by_when_routed(client: openai.OpenAI, model: str) -> str | None:
    """Like answered_by, but None while the watch has not yet delivered the objects (404/503 meanwhile)."""
    try:
        return answered_by(client, model)
    except openai.APIStatusError as exc:
        if exc.status_code in (404, 503):
            return None
        raise


def test_gateway_routes_from_the_cluster_and_follows_changes(
    paused_operator: None, kube: Kube, namespace: str, upstreams: dict[str, str], gateway: str
) -> None:
    # paused_operator comes first so that it is torn down last: the failure dump of the namespace then
    # shows what happened during the test, not what the resumed operator did afterwards.
    spec: dict[str, Any] = {"source": {"uri": "/models/x"}, "engine": "transformers"}
    for name in ("v1", "v2"):
        kube.create_model(namespace, name, spec)
        set_model_status(kube, namespace, name, ready=True)
    kube.create_feature(namespace, "chat", {"model": "v1"})
    set_weights(kube, namespace, "chat", {"v1": 100})
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=10)
    chat = f"{namespace}/chat"

    wait_until("chat routed to v1", lambda: answered_by_when_routed(client, chat) == "v1", timeout=15)
    listed = {m.id for m in client.models.list().data}
    assert {f"{namespace}/chat", f"{namespace}/v1", f"{namespace}/v2"} <= listed
    assert "chat" not in listed, "a plain name resolved outside the gateway's serving namespaces"

    # A status naming another endpoint (here v2's server; could be another team's) redirects nothing.
    set_model_status(kube, namespace, "v1", ready=True, endpoint=upstreams["v2"])
    set_model_status(kube, namespace, "v2", ready=False)  # a barrier: once v2 leaves, v1's change was seen
    wait_until("v2 not ready", lambda: answered_by_when_routed(client, f"{namespace}/v2") is None, timeout=10)
    assert all(answered_by(client, chat) == "v1" for _ in range(5))
    set_model_status(kube, namespace, "v1", ready=True)
    set_model_status(kube, namespace, "v2", ready=True)

    changed = time.monotonic()
    set_weights(kube, namespace, "chat", {"v2": 100})
    wait_until("chat routed to v2", lambda: answered_by_when_routed(client, chat) == "v2", timeout=10, interval=0.01)
    (ARTIFACTS / "gateway-watch-latency.txt").write_text(
        f"weight change applied after {time.monotonic() - changed:.3f}s\n"
    )

    # A model that is not Ready gets no traffic: the split renormalises over ready backends. The split is seen
    # first (v1 answers again): the feature and the models come by separate watches, so a v2 not ready seen
    # before the new split would leave chat, for that moment, with no ready backend (a 503, rightly).
    set_weights(kube, namespace, "chat", {"v1": 50, "v2": 50})
    wait_until("the 50/50 split", lambda: answered_by(client, chat) == "v1", timeout=10, interval=0.01)
    set_model_status(kube, namespace, "v2", ready=False)
    wait_until("v2 excluded", lambda: all(answered_by(client, chat) == "v1" for _ in range(10)), timeout=10)

    kube.delete_model(namespace, "v1")
    with pytest.raises(openai.APIStatusError) as info:
        wait_until("no ready backend left", lambda: answered_by(client, chat) == "never", timeout=10)
    assert info.value.status_code == 503
