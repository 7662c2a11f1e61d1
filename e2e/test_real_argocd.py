"""GitOps via Argo CD, for real (issue #34): Argo CD v3.6.2's application controller and repo-server
(tests/support/argocd.py, built by localcluster/build-argocd.sh) sync a team's AIModels and AIFeatures from a git
repository the test owns (served by `git daemon`) into the real-node cluster, where the operator (a host process
with its chart RBAC) runs the model pods. argocd-cm carries what examples/argocd/argocd-cm.yaml ships (our health
checks and settings); the Application is examples/argocd/apps/team-search.yaml pointed at that repository.

In order (the tests share the Application, each starts from where the last one left it):
1. the Application syncs two models and two features, is Synced at once and Healthy only once the operator
   reports the models Ready (each feature too, once the models it routes to are); it never leaves Synced, nor
   syncs again, while the operator writes their status;
2. a hard refresh compares everything again with the operator's status and bookkeeping on the live objects:
   still Synced, no new sync;
3. self-heal: the split feature's weights edited by hand are put back to git's by Argo CD (a partial sync of
   that object alone), and the operator follows git (its status.weights) without ever writing the spec;
4. a commit deleting a model (and the feature that splits over it) prunes both while the operator is stopped:
   nothing waits for it.

The whole module takes about 4.5 minutes here, 2.5 of them the real node's start and image import.
Canaries driven by commits: e2e/test_argocd_canary.py; the chart and the whole GitOps example as Applications:
e2e/test_argocd_gitops_example.py.
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.support.argocd import ArgoCD, GitRepo, running_argocd, summary, team_application
from tests.support.cluster_harness import RUNTIME_CPU_IMAGE, Kube, OperatorProcess
from tests.support.polling import wait_until
from tests.support.real_pods import (
    ModelRollout,
    delete_local_claim,
    describe_model,
    gone,
    local_model_claim,
    model_on_the_real_node,
    operator_process,
    real_node_kube,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

TEAM, APP, CLAIM = "team-argo", "team-argo", "models"
MODELS = ("tiny-a", "tiny-b")
FEATURE, SPLIT = "chat", "ab"
GIT_WEIGHTS = {"tiny-a": 80, "tiny-b": 20}
READY_DEADLINE = 420  # s: two model pods starting on the 2-CPU node
SYNC_DEADLINE = 120  # s: a commit, a hard refresh, a sync
GROUP = "servlane.dev/v1alpha1"
HAND_EDIT_MANAGER = "kubectl-edit"


def model_doc(name: str) -> dict[str, Any]:
    spec = model_on_the_real_node(CLAIM, "tiny", {"cpu": "200m", "memory": "1536Mi"})
    return {"apiVersion": GROUP, "kind": "AIModel", "metadata": {"name": name}, "spec": spec}


def feature_doc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "AIFeature", "metadata": {"name": name}, "spec": spec}


def split(weights: dict[str, int]) -> list[dict[str, Any]]:
    return [{"model": model, "weight": weight} for model, weight in weights.items()]


def weights(status: dict[str, Any]) -> dict[str, int]:
    """The traffic split the operator reports (status.weights), by model."""
    return {w["model"]: w["weight"] for w in status.get("weights") or []}


@dataclass
class Seen:
    """One look at the Application, then at the objects it manages (in that order: a model Ready when the app
    was Healthy is still Ready when read after it)."""

    at: float
    app: dict[str, Any]
    models: dict[str, str | None]  # phase as the operator reports it


@dataclass
class GitOps:
    cluster: LocalCluster
    kube: Kube
    argocd: ArgoCD
    repo: GitRepo
    operator: OperatorProcess
    seen: list[Seen] = field(default_factory=list)

    def observe(self) -> Seen:
        app = summary(self.argocd.app(APP))
        models: dict[str, str | None] = {}
        for name in MODELS:
            try:
                models[name] = (self.kube.get_model(TEAM, name).get("status") or {}).get("phase", "")
            except Exception:  # not created yet, or pruned
                models[name] = None
        got = Seen(time.monotonic(), app, models)
        self.seen.append(got)
        return got

    def story(self) -> str:
        parts = [f"Application {APP}: {self.seen[-1].app if self.seen else '(never seen)'}"]
        parts += [describe_model(self.cluster, TEAM, name) for name in MODELS]
        parts.append(self.argocd.story())
        return "\n".join(parts)

    def wait(self, what: str, check: Any, timeout: float = SYNC_DEADLINE, interval: float = 0.5) -> Any:
        try:
            return wait_until(what, check, timeout=timeout, interval=interval)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.story()}") from None

    def commit_and_refresh(self, message: str) -> str:
        revision = self.repo.commit(message)
        self.argocd.refresh(APP)
        return revision

    def synced_at(self, revision: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            app = self.observe().app
            return app if app["sync"] == "Synced" and app["revision"] == revision else None

        got: dict[str, Any] = self.wait(f"{APP} Synced at {revision[:8]}", check)
        return got

    def feature(self, name: str) -> dict[str, Any]:
        return self.kube.get_feature(TEAM, name)


@pytest.fixture(scope="module")
def gitops(real_cluster: LocalCluster, real_node_images: list[str]) -> Iterator[GitOps]:
    assert RUNTIME_CPU_IMAGE in real_node_images
    from servlane_devtools.tiny_model import build_tiny_llama

    c = real_cluster
    kube = real_node_kube(c, TEAM)
    workdir = c.workdir / "argocd"
    workdir.mkdir(exist_ok=True)
    local_model_claim(c, TEAM, CLAIM, {"tiny": build_tiny_llama()})
    try:
        with (
            operator_process(c, kube, "operator-argocd") as operator,
            running_argocd(c, workdir / "run") as argocd,
            GitRepo(workdir / "gitops").served() as repo,
        ):
            gitops = GitOps(c, kube, argocd, repo, operator)
            try:
                yield gitops
            finally:
                argocd.delete_app(APP)
    finally:
        try:
            c.api("DELETE", f"/api/v1/namespaces/{TEAM}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        delete_local_claim(c, TEAM, CLAIM)


def test_application_is_synced_then_healthy_once_the_models_are_ready(gitops: GitOps) -> None:
    g = gitops
    for name in MODELS:
        g.repo.write(f"team/model-{name}.yaml", model_doc(name))
    g.repo.write(f"team/feature-{FEATURE}.yaml", feature_doc(FEATURE, {"model": "tiny-a"}))
    g.repo.write(f"team/feature-{SPLIT}.yaml", feature_doc(SPLIT, {"split": split(GIT_WEIGHTS)}))
    revision = g.repo.commit("two models, a feature on one, a split over both")
    started = time.monotonic()
    rollouts = [ModelRollout(g.cluster, g.kube, TEAM, name) for name in MODELS]
    g.argocd.create_app(team_application(g.repo, APP, TEAM))
    first_synced = g.synced_at(revision)
    print(f"\ncreate -> Synced {time.monotonic() - started:.1f}s: {first_synced}")
    mark = len(g.seen) - 1

    def healthy() -> Seen | None:
        seen = g.observe()
        for rollout in rollouts:
            rollout.check()  # a crashing runtime fails at once, with its pods' story
        return seen if seen.app["health"] == "Healthy" else None

    done: Seen = g.wait(f"{APP} Healthy", healthy, timeout=READY_DEADLINE)
    print(f"create -> Healthy {time.monotonic() - started:.1f}s; models: {[r.timings() for r in rollouts]}")
    window = g.seen[mark:]
    # Healthy only once the operator says Ready: our health check reads the operator's status.
    for seen in window:
        for name in MODELS:
            if seen.app["resources"].get(f"AIModel/{name}", (None, None))[1] == "Healthy":
                assert seen.models[name] == "Ready", (name, seen)
        # A feature is Healthy only once the models it routes to are (its Ready condition; before 2026-12-05 the
        # health check called a Stable or Split feature Healthy while its models were still starting).
        for feature, models in ((FEATURE, ["tiny-a"]), (SPLIT, list(MODELS))):
            if seen.app["resources"].get(f"AIFeature/{feature}", (None, None))[1] == "Healthy":
                assert all(seen.models[m] == "Ready" for m in models), (feature, seen)
        if seen.app["health"] == "Healthy":
            assert all(phase == "Ready" for phase in seen.models.values()), seen
    # The models and features were seen Progressing while the models started (the checks are live).
    every = {f"AIModel/{n}" for n in MODELS} | {f"AIFeature/{FEATURE}", f"AIFeature/{SPLIT}"}
    progressing = {k for s in window for k in every if s.app["resources"].get(k, ("", ""))[1] == "Progressing"}
    assert progressing == every, [s.app["resources"] for s in window]
    # The operator wrote status all along (phases seen change), and not once did that make the app OutOfSync
    # or start a sync: one sync in history, the first.
    phases = {(n, s.models[n]) for s in window for n in MODELS}
    assert len({p for _, p in phases}) >= 2, phases
    assert {s.app["sync"] for s in window} == {"Synced"}, [s.app for s in window if s.app["sync"] != "Synced"]
    # (a look between the sync's apply and its end may see the history still empty)
    assert {s.app["history"] for s in window} <= {0, 1}, [s.app["operation"] for s in window]
    assert done.app["history"] == 1, done.app
    resources = done.app["resources"]
    assert resources == {
        "AIModel/tiny-a": ("Synced", "Healthy"),
        "AIModel/tiny-b": ("Synced", "Healthy"),
        f"AIFeature/{FEATURE}": ("Synced", "Healthy"),
        f"AIFeature/{SPLIT}": ("Synced", "Healthy"),
    }, done.app
    assert done.app["health_messages"][f"AIFeature/{FEATURE}"] == "Serving tiny-a", done.app


def test_a_hard_refresh_with_the_operators_status_on_every_object_stays_synced(gitops: GitOps) -> None:
    g = gitops
    before = g.observe().app
    for name in MODELS:  # what the operator wrote, which git does not have
        live = g.kube.get_model(TEAM, name)
        assert live["status"]["phase"] == "Ready", live["status"]
    assert weights(g.feature(SPLIT)["status"]) == GIT_WEIGHTS
    for _ in range(2):
        g.argocd.refresh(APP)
        after: dict[str, Any] = g.wait("the hard refresh's comparison", lambda: g.argocd.compared(APP))
        assert after["sync"] == "Synced", after
        assert after["health"] == "Healthy", after
        assert after["history"] == before["history"], after
        assert after["revision"] == before["revision"], after
        assert {state for state, _ in after["resources"].values()} == {"Synced"}, after


def spec_managers(obj: dict[str, Any]) -> set[str]:
    """The field managers that own something under spec."""
    return {
        entry["manager"]
        for entry in obj["metadata"].get("managedFields") or []
        if "f:spec" in (entry.get("fieldsV1") or {})
    }


def test_self_heal_puts_back_weights_edited_by_hand(gitops: GitOps) -> None:
    g = gitops
    before = g.observe().app
    by_hand = {"tiny-a": 50, "tiny-b": 50}
    patched = g.cluster.api(
        "PATCH",
        f"/apis/{GROUP}/namespaces/{TEAM}/aifeatures/{SPLIT}?fieldManager={HAND_EDIT_MANAGER}",
        {"spec": {"split": split(by_hand)}},
        content_type="application/merge-patch+json",
    )
    assert patched["spec"]["split"] == split(by_hand)
    edited_generation = patched["metadata"]["generation"]

    def restored() -> dict[str, Any] | None:
        live = g.feature(SPLIT)
        healed = live["spec"]["split"] == split(GIT_WEIGHTS) and live["metadata"]["generation"] > edited_generation
        return live if healed else None

    live: dict[str, Any] = g.wait("Argo CD to restore git's weights", restored, timeout=60, interval=0.2)

    def healed() -> dict[str, Any] | None:
        app = g.observe().app
        done = app["operation_started"] != before["operation_started"] and app["operation"].startswith("Succeeded")
        return app if done and app["sync"] == "Synced" else None

    # Self-heal is a partial sync of what drifted: the edited feature alone, at git's revision, not in the history.
    after: dict[str, Any] = g.wait("the self-heal sync, Synced", healed, timeout=60)
    assert after["operation_synced"] == [f"AIFeature/{SPLIT}"], after
    assert (after["revision"], after["history"]) == (before["revision"], before["history"]), after

    # The operator follows git: its traffic split is git's again, for the generation Argo CD wrote.
    def followed() -> dict[str, Any] | None:
        status = g.feature(SPLIT).get("status") or {}
        current = status.get("observedGeneration") == live["metadata"]["generation"]
        return status if current and weights(status) == GIT_WEIGHTS else None

    g.wait("the operator to route git's weights", followed, timeout=60)
    # ... and never wrote the spec itself: only Argo CD and the hand edit ever owned fields of it.
    assert spec_managers(g.feature(SPLIT)) <= {"argocd-controller", HAND_EDIT_MANAGER}, g.feature(SPLIT)
    g.wait("Healthy again", lambda: g.observe().app["health"] == "Healthy", timeout=60)


def test_a_commit_deleting_a_model_prunes_it_with_the_operator_stopped(gitops: GitOps) -> None:
    g = gitops
    g.operator.stop()
    try:
        g.repo.remove(f"team/feature-{SPLIT}.yaml")
        g.repo.remove("team/model-tiny-b.yaml")
        started = time.monotonic()
        revision = g.commit_and_refresh("tiny-b and the split over it are gone")
        model = f"/apis/{GROUP}/namespaces/{TEAM}/aimodels/tiny-b"
        feature = f"/apis/{GROUP}/namespaces/{TEAM}/aifeatures/{SPLIT}"
        g.wait("tiny-b and its split pruned", lambda: gone(g.cluster, model) and gone(g.cluster, feature))
        print(f"\ncommit -> pruned {time.monotonic() - started:.1f}s (operator stopped)")
        app = g.synced_at(revision)
        assert set(app["resources"]) == {"AIModel/tiny-a", f"AIFeature/{FEATURE}"}, app
        # Its pods go by garbage collection (ownerReferences), without the operator either.
        deployment = f"/apis/apps/v1/namespaces/{TEAM}/deployments/model-tiny-b"
        g.wait("tiny-b's Deployment collected", lambda: gone(g.cluster, deployment), timeout=60)
    finally:
        g.operator.start()
    g.wait("Healthy with what is left", lambda: g.observe().app["health"] == "Healthy", timeout=60)
