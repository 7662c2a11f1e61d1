"""Canaries driven by git commits through a real Argo CD (issue #34): Argo CD v3.6.2's controller and repo-server
(tests/support/argocd.py) sync a team's AIModels and AIFeature from a git repository the test owns into the local
cluster, where the operator rolls each change of the feature's model out as a canary, analysed on the gateway's
metrics in a real Prometheus, under load from the `openai` client through the gateway (`model: chat`).

The canary stack is e2e/test_canary_full.py's: KWOK pods become Ready without running, so the gateway sends each
AIModel's in-cluster address to a runtime process on loopback serving the tiny Llama. In order (the tests share
the Application, each starts where the last left it):
1. the first commit: three models and a feature on v1; the Application Synced, then Healthy;
2. a commit moving the feature to v2: Argo CD shows the AIFeature Progressing ("Rolling out canary v2 at N%") while
   the canary runs, Healthy ("Serving v2") after promotion; Synced all along, one sync for the commit;
3. a commit moving it to a broken model (its runtime answers every chat with a 400: no chat template): rolled back,
   the AIFeature and the Application Degraded with the rollback's message, every request after the rollback
   answered by v2; still Synced (git says `notpl` and so does the cluster: the rollback is status, not drift) and a
   hard refresh does not sync again; the operator never wrote the spec;
4. the fix the docs give, a commit pointing the feature back at v2: Healthy again, no canary (v2 is the stable).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e import canary_stack
from e2e.canary_faults import PrometheusProcess, without_chat_template
from e2e.canary_stack import (
    CPU_MODEL,
    STEPS,
    Gateway,
    RuntimeProcess,
    rollout,
    runtime_config,
    start_gateway,
    wait_served,
)
from e2e.traffic import Load
from localcluster.cluster import LocalCluster, stop_process_groups
from tests.support.argocd import ArgoCD, GitRepo, running_argocd, summary, team_application
from tests.support.cluster_harness import ARTIFACTS, Kube, OperatorProcess, namespace_body, wait_until

model_dir = canary_stack.model_dir
gateway_port = canary_stack.gateway_port
prometheus = canary_stack.prometheus
canary_operator = canary_stack.canary_operator

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

APP, FEATURE = "team-canary", "chat"
GROUP = "servlane.dev/v1alpha1"
RESOURCE = f"AIFeature/{FEATURE}"
MODELS = ("v1", "v2", "notpl")  # notpl: the tiny model without its chat template, a 400 for every chat
SYNC_DEADLINE = 120  # s: a commit, a hard refresh, a sync
CANARY_DEADLINE = 120  # s: three 3 s steps and their analyses, on a busy 2-CPU machine


@pytest.fixture(scope="module")
def workdir() -> Path:
    path = ARTIFACTS / "argocd-canary"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runtimes(model_dir: Path, workdir: Path) -> Iterator[dict[str, RuntimeProcess]]:
    no_template = without_chat_template(model_dir, workdir / "tiny-llama-no-chat-template")
    dirs = {"v1": model_dir, "v2": model_dir, "notpl": no_template}
    started = {name: RuntimeProcess(runtime_config(path, name), workdir).start() for name, path in dirs.items()}
    try:
        for name, runtime in started.items():
            runtime.wait("ready")
            if name != "notpl":
                runtime.warm_up()  # judged warm, as test_canary_full.py's (see warm_up)
        yield started
    finally:
        for runtime in started.values():
            runtime.stop()


def model_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "AIModel", "metadata": {"name": name}, "spec": CPU_MODEL}


def feature_doc(model: str) -> dict[str, Any]:
    spec = {"model": model, "rollout": rollout("3s")}
    return {"apiVersion": GROUP, "kind": "AIFeature", "metadata": {"name": FEATURE}, "spec": spec}


@dataclass
class Seen:
    """One look at the Application, then at the feature's status."""

    app: dict[str, Any]
    feature: dict[str, Any]

    @property
    def health(self) -> tuple[str | None, str | None]:
        """The AIFeature's health as Argo CD shows it: (status, message)."""
        state = self.app["resources"].get(RESOURCE, (None, None))[1]
        return state, self.app["health_messages"].get(RESOURCE)


@dataclass
class CanaryGitOps:
    kube: Kube
    namespace: str
    argocd: ArgoCD
    repo: GitRepo
    gateway: Gateway
    seen: list[Seen] = field(default_factory=list)

    def observe(self) -> Seen:
        app = summary(self.argocd.app(APP))
        feature = self.kube.get_feature(self.namespace, FEATURE)
        got = Seen(app, feature)
        self.seen.append(got)
        return got

    def story(self) -> str:
        last = self.seen[-1] if self.seen else None
        parts = [f"Application {APP}: {last.app if last else '(never seen)'}"]
        parts.append(f"AIFeature {FEATURE} status: {(last.feature.get('status') if last else None)}")
        parts.append(self.argocd.story())
        return "\n".join(parts)

    def wait(self, what: str, check: Any, timeout: float = SYNC_DEADLINE, interval: float = 0.2) -> Any:
        try:
            return wait_until(what, check, timeout=timeout, interval=interval)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.story()}") from None

    def commit_model(self, model: str) -> str:
        self.repo.write(f"team/feature-{FEATURE}.yaml", feature_doc(model))
        revision = self.repo.commit(f"chat answered by {model}")
        self.argocd.refresh(APP)
        return revision

    def watch_until(self, what: str, done: Any, timeout: float = CANARY_DEADLINE) -> list[Seen]:
        """Every look from now until `done(seen)` holds; the looks are what the assertions read."""
        mark = len(self.seen)
        self.wait(what, lambda: done(self.observe()), timeout=timeout)
        return self.seen[mark:]


def status(seen: Seen) -> dict[str, Any]:
    return seen.feature.get("status") or {}


def changes(values: list[Any]) -> list[Any]:
    """`values` without repeats in a row: what was seen, in order."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def since_synced(seen: list[Seen], revision: str) -> list[Seen]:
    """The looks from the first one Synced at `revision` on (before it, Argo CD has compared git's new revision
    with the cluster, OutOfSync, and not yet applied it)."""
    first = next((i for i, x in enumerate(seen) if (x.app["sync"], x.app["revision"]) == ("Synced", revision)), None)
    assert first is not None, [(x.app["sync"], x.app["revision"]) for x in seen]
    return seen[first:]


def spec_managers(obj: dict[str, Any]) -> set[str]:
    return {e["manager"] for e in obj["metadata"].get("managedFields") or [] if "f:spec" in (e.get("fieldsV1") or {})}


@pytest.fixture(scope="module")
def gitops(
    local_cluster: LocalCluster | None, crds: Kube, canary_operator: OperatorProcess, prometheus: PrometheusProcess,
    gateway_port: int, runtimes: dict[str, RuntimeProcess], workdir: Path,
) -> Iterator[CanaryGitOps]:  # fmt: skip
    if local_cluster is None:
        pytest.skip("Argo CD runs against the local control plane, not $E2E_KUBECONFIG")
    kube, namespace = crds, f"argo-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(namespace_body(namespace))
    prometheus.ensure_running()
    backends = {name: runtime.base_url for name, runtime in runtimes.items()}
    gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
    try:
        with (
            running_argocd(local_cluster, workdir / "argocd") as argocd,
            GitRepo(workdir / f"gitops-{namespace}").served() as repo,
        ):
            gitops = CanaryGitOps(kube, namespace, argocd, repo, gateway)
            try:
                yield gitops
            finally:
                argocd.delete_app(APP)
    finally:
        stop_process_groups([gateway.proc.pid], timeout=10)
        gateway.proc.wait(timeout=5)
        kube.core.delete_namespace(namespace)


def test_the_first_commit_syncs_and_is_healthy_on_v1(gitops: CanaryGitOps) -> None:
    g = gitops
    for name in MODELS:
        g.repo.write(f"team/model-{name}.yaml", model_doc(name))
    g.repo.write(f"team/feature-{FEATURE}.yaml", feature_doc("v1"))
    revision = g.repo.commit("three models, chat on v1")
    g.argocd.create_app(team_application(g.repo, APP, g.namespace))

    def healthy(seen: Seen) -> bool:
        app = seen.app
        return app["revision"] == revision and (app["sync"], app["health"]) == ("Synced", "Healthy")

    seen = g.watch_until(f"{APP} Synced and Healthy", healthy, timeout=SYNC_DEADLINE)
    assert seen[-1].health == ("Healthy", "Serving v1"), seen[-1].app
    assert status(seen[-1])["weights"] == [{"model": "v1", "weight": 100}]


def test_a_commit_changing_the_model_shows_the_canary_progressing_then_healthy(gitops: CanaryGitOps) -> None:
    g = gitops
    before = g.observe().app
    with Load(g.gateway.url + "/v1") as load:
        wait_served(load, "v1")
        started = time.monotonic()
        revision = g.commit_model("v2")

        def promoted(seen: Seen) -> bool:
            s = status(seen)
            return s.get("phase") == "Stable" and s.get("stableModel") == "v2" and seen.health[0] == "Healthy"

        seen = g.watch_until("v2 promoted, and Healthy in Argo CD", promoted)
        promoted_at = time.monotonic()
        wait_until("only v2 answers", lambda: load.only_answered_by("v2", promoted_at), timeout=30)
    during = load.answered_since(started)
    print(f"\ncommit -> promoted {promoted_at - started:.1f}s; Argo CD showed: {changes([s.health for s in seen])}")

    # Argo CD showed the canary while it ran, with the operator's weights, and Healthy once promoted.
    # (Progressing also, briefly, before the operator has observed the new generation.)
    canary_looks = {f"Rolling out canary v2 at {w}%" for w in STEPS}
    progressing = [s.health[1] or "" for s in seen if s.health[0] == "Progressing"]
    assert canary_looks & set(progressing), [s.health for s in seen]
    unexplained = [m for m in progressing if m not in canary_looks and "has not yet observed generation" not in m]
    assert unexplained == [], unexplained
    assert seen[-1].health == ("Healthy", "Serving v2"), seen[-1].app
    assert seen[-1].app["health"] == "Healthy", seen[-1].app
    # Synced all along once the commit was applied, and one sync for it: the operator's status writes through
    # every step were never drift.
    applied = since_synced(seen, revision)
    assert {s.app["sync"] for s in applied} == {"Synced"}, [s.app["sync"] for s in applied]
    assert seen[-1].app["history"] == before["history"] + 1, seen[-1].app
    # Clients saw both versions and no error: a healthy rollout loses nothing.
    assert {o.model for o in during} >= {"v1", "v2"}
    assert [o for o in during if o.error] == []


def test_a_commit_pointing_at_a_broken_model_is_rolled_back_and_degraded(gitops: CanaryGitOps) -> None:
    g = gitops
    before = g.observe().app
    with Load(g.gateway.url + "/v1") as load:
        wait_served(load, "v2")
        started = time.monotonic()
        revision = g.commit_model("notpl")

        def degraded(seen: Seen) -> bool:
            return status(seen).get("phase") == "RolledBack" and seen.app["health"] == "Degraded"

        seen = g.watch_until("notpl rolled back, and Degraded in Argo CD", degraded)
        wait_until("gateway on v2 only", lambda: g.gateway.route_weights() == {"v2": 100.0}, 30, interval=0.05)
        stable_at = time.monotonic()
        wait_until("clients served by v2 again", lambda: load.only_answered_by("v2", stable_at), timeout=30)
    outcomes = load.answered_since(started)
    shown = changes([x.health for x in seen])
    print(f"\ncommit -> traffic on v2 only {stable_at - started:.1f}s; Argo CD showed: {shown}")

    final = seen[-1]
    s = status(final)
    assert (s["rolledBackModel"], s["stableModel"], s["weights"]) == ("notpl", "v2", [{"model": "v2", "weight": 100}])
    state, message = final.health
    assert state == "Degraded", final.app
    assert message is not None, final.app
    assert message.startswith("Canary notpl was rolled back; still serving v2."), message
    assert "maxErrorRate" in message, message  # the operator's reason, as the person reading Argo CD needs it
    assert any(h[0] == "Progressing" for h in (x.health for x in seen)), [x.health for x in seen]
    # Traffic: the canary's share got its 400s until the rollback, and nothing failed after it.
    failed = [o for o in outcomes if o.error is not None]
    assert {o.error for o in failed} <= {"400"}, Counter(o.error for o in failed)
    assert all(o.started < stable_at for o in failed), [o for o in failed if o.started >= stable_at]
    assert {o.model for o in outcomes if o.error is None} <= {"v2"}, Counter(o.model for o in outcomes)
    # The rollback is status, not drift: git and the cluster both say notpl; Synced, one sync for the commit.
    applied = since_synced(seen, revision)
    assert {x.app["sync"] for x in applied} == {"Synced"}, [x.app["sync"] for x in applied]
    assert final.feature["spec"]["model"] == "notpl"
    assert final.app["history"] == before["history"] + 1, final.app
    # ... also when everything is compared again, past the caches.
    g.argocd.refresh(APP)
    after: dict[str, Any] = g.wait("the hard refresh's comparison", lambda: g.argocd.compared(APP))
    assert (after["sync"], after["health"], after["history"]) == ("Synced", "Degraded", final.app["history"]), after
    # The operator rolled back by status alone: only Argo CD ever owned the feature's spec.
    assert spec_managers(g.kube.get_feature(g.namespace, FEATURE)) == {"argocd-controller"}


def test_the_documented_fix_a_commit_back_to_the_stable_is_healthy_again(gitops: CanaryGitOps) -> None:
    g = gitops
    before = g.observe().app
    revision = g.commit_model("v2")

    def healthy(seen: Seen) -> bool:
        return bool(seen.app["revision"] == revision and seen.app["health"] == "Healthy")

    seen = g.watch_until("Healthy on v2 again", healthy)
    assert seen[-1].health == ("Healthy", "Serving v2"), seen[-1].app
    s = status(seen[-1])
    assert (s["phase"], s["weights"]) == ("Stable", [{"model": "v2", "weight": 100}]), s
    # v2 is already the stable: no canary, straight back to Stable.
    assert all(status(x).get("phase") in ("RolledBack", "Stable") for x in seen), [status(x) for x in seen]
    assert not any(c["type"] == "Degraded" and c["status"] == "True" for c in s["conditions"]), s["conditions"]
    assert seen[-1].app["history"] == before["history"] + 1, seen[-1].app
