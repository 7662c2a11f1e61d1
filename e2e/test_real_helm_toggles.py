"""The chart's optional settings, all on at once, against the shipped images on the real node (e2e/conftest.py
`real_cluster`): tracing to an OTLP collector that is not there (yet), API keys, the console, two gateway
worker processes, the NetworkPolicies, the Batch API in PostgreSQL, rate limits shared through Redis and the
response cache in Redis. Each of these makes the gateway import or start something that the default install
never does, so only a pod that runs the image with them on shows that the image has what they need:
`tracing.enabled: true` once crash-looped the gateway pod, whose image lacked the OpenTelemetry SDK.

PostgreSQL and Redis run on the host, reached by the pods through Services without selectors
(e2e/host_services.py); the chart is pointed at them the way a user does: the database URL and the Redis
password in Secrets of the release namespace, the Redis by its Service name. One tiny model serves the
feature the batch, the cache and the limits go through.

Its own release and namespaces, installed and uninstalled here, so it runs beside e2e/test_real_helm.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from e2e.host_services import HostPostgres, HostRedis, expose, private_directory
from localcluster.cluster import LocalCluster
from servlane_gateway.cache.rules import CACHE_HEADER, Entry
from tests.support.cluster_harness import ARTIFACTS, GATEWAY_IMAGE, OPERATOR_IMAGE, RUNTIME_CPU_IMAGE, Kube
from tests.support.helm_install import gateway_node_port, helm_or_fail, install_chart, uninstall_chart
from tests.support.helm_toggles import RELEASE, SYSTEM, TEAM, toggles_values
from tests.support.helmtool import Helm
from tests.support.polling import wait_until
from tests.support.real_pods import (
    NODE,
    ModelRollout,
    delete_local_claim,
    describe_pods,
    ensure_namespace,
    local_model_claim,
    model_on_the_real_node,
    pod_log,
    pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

DATA = "toggles-data"  # the namespace of the Services in front of the host's PostgreSQL and Redis
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
REDIS_SECRET, DATABASE_SECRET = "toggles-redis", "toggles-batch-database"
# The chart's default key prefix: the release namespace and the gateway's name, so releases sharing a Redis
# never share a budget or an answer.
REDIS_PREFIX = f"servlane:{SYSTEM}:{RELEASE}-gateway"
LIMITS_DB, CACHE_DB = 0, 1  # responseCache.redis.database null: the limits' database + 1
REQUESTS_PER_MINUTE = 20  # per API key; the admin key's own requests here stay far below it
CLAIM, MODEL, FEATURE = "models", "tiny", "chat"


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def with_shared_stores(values: dict[str, Any], limited_digest: str, redis_host: str) -> dict[str, Any]:
    """The toggles that need servers: the Batch API in PostgreSQL (its URL in a Secret), a per-key rate limit
    shared through Redis (its password in a Secret) and the response cache in that Redis (the chart's default
    database: the limits' + 1); plus a second key, scoped to the team, that the limit test spends."""
    gateway = values["gateway"]
    gateway["apiKeys"]["entries"].append({"name": "limited", "key": limited_digest, "features": [f"{TEAM}/*"]})
    gateway["rateLimits"] = {
        "keyRequestsPerMinute": REQUESTS_PER_MINUTE,
        "redis": {
            "url": f"redis://{redis_host}:6379/{LIMITS_DB}",
            "passwordSecret": {"name": REDIS_SECRET, "key": "password"},
        },
    }
    gateway["batch"] = {"enabled": True, "databaseUrl": {"secretName": DATABASE_SECRET, "key": "url"}}
    return values


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


class Toggled:
    def __init__(
        self, cluster: LocalCluster, helm: Helm, key: str, limited_key: str, redis: HostRedis, postgres: HostPostgres
    ) -> None:
        self.cluster, self.helm, self.key, self.limited_key = cluster, helm, key, limited_key
        self.redis, self.postgres = redis, postgres
        self.base = ""  # http://127.0.0.1:<nodePort>

    def story(self) -> str:
        return describe_pods(self.cluster, SYSTEM, SELECTOR)

    def call(self, path: str, key: str | None = None, body: dict[str, Any] | None = None) -> Answer:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Authorization", f"Bearer {key}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the host's proxy is not the way in
        try:
            with opener.open(request, timeout=60) as response:
                return Answer(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())

    def get(self, path: str, key: str | None = None) -> tuple[int, dict[str, str]]:
        answer = self.call(path, key)
        return answer.status, answer.headers

    def client(self, key: str) -> openai.OpenAI:
        http = openai.DefaultHttpxClient(trust_env=False, timeout=60)
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, http_client=http)


def secret(name: str, key: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "type": "Opaque", "data": {key: base64.b64encode(value.encode()).decode()}}


def delete_namespace(c: LocalCluster, namespace: str) -> None:
    try:
        c.api("DELETE", f"/api/v1/namespaces/{namespace}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


@pytest.fixture(scope="module")
def toggled(real_cluster: LocalCluster, real_node_images: list[str]) -> Iterator[Toggled]:
    assert {RUNTIME_CPU_IMAGE, OPERATOR_IMAGE, GATEWAY_IMAGE} <= set(real_node_images)
    node = real_cluster.node
    assert node is not None
    assert node.address
    helm = helm_or_fail()
    directory = private_directory("servlane-toggles-")
    redis = HostRedis(directory, node.address)
    postgres = HostPostgres(directory, node.address)
    try:
        redis.start()
        postgres.start()
        for namespace in (TEAM, DATA, SYSTEM):
            ensure_namespace(real_cluster, namespace)
        redis_host = expose(real_cluster, DATA, "redis", 6379, node.address, redis.port)
        postgres_host = expose(real_cluster, DATA, "postgres", 5432, node.address, postgres.port)
        for body in (
            secret(REDIS_SECRET, "password", redis.password),
            secret(DATABASE_SECRET, "url", postgres.dsn(postgres_host, 5432)),
        ):
            real_cluster.api("POST", f"/api/v1/namespaces/{SYSTEM}/secrets", body)
        inst = Toggled(
            real_cluster, helm, "sk-" + secrets.token_hex(16), "sk-" + secrets.token_hex(16), redis, postgres
        )
        values = with_shared_stores(toggles_values(digest(inst.key)), digest(inst.limited_key), redis_host)
        seconds = install_chart(
            real_cluster, helm, RELEASE, SYSTEM, values, ARTIFACTS / "real-helm-toggles-values.yaml", inst.story
        )
        print(f"\nhelm install --wait with every toggle on: {seconds:.1f}s")
        inst.base = gateway_node_port(real_cluster, RELEASE, SYSTEM)
        try:
            yield inst
        finally:
            uninstall_chart(real_cluster, helm, RELEASE, SYSTEM)
    finally:
        delete_local_claim(real_cluster, TEAM, CLAIM)
        for namespace in (TEAM, DATA, SYSTEM):
            delete_namespace(real_cluster, namespace)
        redis.stop()
        postgres.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_every_pod_runs_without_a_restart(toggled: Toggled) -> None:
    found = pods(toggled.cluster, SYSTEM, SELECTOR)
    assert {p["spec"]["containers"][0]["image"] for p in found} == {OPERATOR_IMAGE, GATEWAY_IMAGE}, toggled.story()
    for pod in found:
        assert pod["spec"]["nodeName"] == NODE
        statuses = pod["status"]["containerStatuses"]
        assert all(cs["ready"] and cs["restartCount"] == 0 for cs in statuses), toggled.story()


def test_the_gateway_serves_with_tracing_keys_console_and_two_workers(toggled: Toggled) -> None:
    wait_until(
        "the gateway's /health through its NodePort",
        lambda: toggled.get("/health")[0] == 200,
        timeout=60,
        interval=1,
        tolerate=lambda exc: isinstance(exc, OSError),
    )
    assert toggled.get("/v1/models")[0] == 401, "API keys are configured: no key, no models"
    status, headers = toggled.get("/v1/models", toggled.key)
    assert status == 200, toggled.story()
    lowered = {k.lower(): v for k, v in headers.items()}
    assert len(lowered.get("x-trace-id", "")) == 32, f"no trace id with tracing on: {headers}"
    assert toggled.get("/console/api/state", toggled.key)[0] == 200, toggled.story()
    (gateway,) = pods(toggled.cluster, SYSTEM, f"{SELECTOR},app.kubernetes.io/component=gateway")
    log = pod_log(toggled.cluster, SYSTEM, gateway["metadata"]["name"], "gateway")
    assert "tracing on" in log, log  # the exporter's failures to reach the absent collector are only logged


def test_the_network_policies_are_installed(toggled: Toggled) -> None:
    found = toggled.cluster.api("GET", f"/apis/networking.k8s.io/v1/namespaces/{SYSTEM}/networkpolicies")["items"]
    names = sorted(p["metadata"]["name"] for p in found)
    assert names == sorted([f"{RELEASE}-gateway", f"{RELEASE}-operator"]), names


@pytest.fixture(scope="module")
def served(toggled: Toggled) -> Toggled:
    """The tiny model behind the feature `chat` (its responseCache on), routed by the gateway pod."""
    from servlane_devtools.tiny_model import build_tiny_llama

    c = toggled.cluster
    local_model_claim(c, TEAM, CLAIM, {MODEL: build_tiny_llama()})
    kube = Kube(c.kubeconfig)
    rollout = ModelRollout(c, kube, TEAM, MODEL)
    kube.create_model(TEAM, MODEL, model_on_the_real_node(CLAIM, MODEL, {"cpu": "200m", "memory": "1536Mi"}))
    rollout.wait_ready(420)
    print(f"\napply -> Ready, {MODEL}: {rollout.timings()}")
    kube.create_feature(TEAM, FEATURE, {"model": MODEL, "responseCache": {"enabled": True}})

    def routed() -> bool:
        answer = toggled.call("/v1/models", toggled.key)
        return answer.status == 200 and FEATURE in {m["id"] for m in json.loads(answer.body)["data"]}

    wait_until("the gateway pod lists chat", routed, timeout=120, interval=1, tolerate=lambda e: isinstance(e, OSError))
    return toggled


def test_a_batch_runs_through_the_gateway_pod_and_lives_in_postgresql(served: Toggled) -> None:
    api = served.client(served.key)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": FEATURE, "messages": [{"role": "user", "content": f"Batch line {i}"}], "max_tokens": 4},
        }
        for i in range(2)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    upload = api.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")

    def ended() -> openai.types.Batch | None:
        got = api.batches.retrieve(batch.id)
        return got if got.status in ("completed", "failed", "cancelled", "expired") else None

    done = wait_until(f"batch {batch.id} to end", ended, timeout=240, interval=1)
    assert done.status == "completed", f"{done}\n{served.story()}"
    assert done.output_file_id is not None
    output = api.files.content(done.output_file_id).content
    results = [json.loads(line) for line in output.decode().splitlines()]
    assert sorted(r["custom_id"] for r in results) == ["line-0", "line-1"], results
    for result in results:
        assert result["response"]["status_code"] == 200, result
        assert result["response"]["body"]["model"] == MODEL, result
        # Generated by the model: a random tiny model's first sampled token may be its end (content ''), so the
        # count says it ran, not the text.
        body = result["response"]["body"]
        assert body["choices"][0]["message"]["role"] == "assistant", result
        assert isinstance(body["choices"][0]["message"]["content"], str), result
        assert 1 <= body["usage"]["completion_tokens"] <= 4, result

    # What the replicas share is in the PostgreSQL the Secret names (the schema was migrated at the pod's start).
    with served.postgres.connect() as conn:
        row = conn.execute(
            "SELECT status, owner, total, completed, failed, output_file_id, input_bytes FROM batches WHERE id = %s",
            (batch.id,),
        ).fetchone()
        assert row == ("completed", "team-toggles", 2, 2, 0, done.output_file_id, len(data)), row
        # Its copy of the lines, and their results, went when it ended: they are in its output file now.
        rows = conn.execute("SELECT custom_id FROM batch_requests WHERE batch_id = %s", (batch.id,)).fetchall()
        assert rows == [], rows
        stored = conn.execute(
            "SELECT f.bytes, sum(length(c.data)) FROM batch_files f JOIN batch_file_chunks c ON c.file_id = f.id"
            " WHERE f.id = %s GROUP BY f.bytes",
            (done.output_file_id,),
        ).fetchone()
        assert stored == (len(output), len(output)), stored


def cacheable(text: str) -> dict[str, Any]:
    """A greedy request: the feature's cache keeps and serves its answer."""
    return {"model": FEATURE, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 4}


def test_a_repeated_request_is_answered_from_the_response_cache_in_redis(served: Toggled) -> None:
    body = cacheable(f"Cache me {secrets.token_hex(4)}")
    first = served.call("/v1/chat/completions", served.key, body)
    assert first.status == 200, first
    assert first.headers[CACHE_HEADER] == "miss"
    cache = served.redis.client(CACHE_DB)
    entries = f"{REDIS_PREFIX}:cache:entries"

    def kept() -> list[str]:  # stored after the answer was sent
        members = [m.decode() if isinstance(m, bytes) else m for m in cache.hkeys(entries)]
        return [m for m in members if m.startswith(f"{TEAM}/{FEATURE}/")]

    (member,) = wait_until(f"the answer kept under {entries}", kept, timeout=20, interval=0.2)
    assert cache.exists(f"{REDIS_PREFIX}:cache:age:{TEAM}/{FEATURE}")
    second = served.call("/v1/chat/completions", served.key, body)
    assert second.status == 200, second
    assert second.headers[CACHE_HEADER] == "hit"
    assert json.loads(second.body)["choices"] == json.loads(first.body)["choices"]
    stored = cache.hget(entries, member)
    entry = Entry.decode(stored) if isinstance(stored, bytes) else None
    assert entry is not None
    assert entry.body == second.body  # served as Redis holds it
    assert not served.redis.client(LIMITS_DB).exists(entries)  # the cache's keys stay out of the limits' database


def test_the_shared_rate_limit_holds_across_the_gateway_workers_in_redis(served: Toggled) -> None:
    """keyRequestsPerMinute for the `limited` key, counted in Redis by both worker processes: of twice the
    limit, sent on fresh connections (the kernel hands each to either worker), only the limit and what refills
    while they are sent is admitted, then 429 with Retry-After; its bucket is in Redis under the release's prefix."""
    body = cacheable(f"Limit me {secrets.token_hex(4)}")  # answered from the cache after the first: cheap
    started = time.monotonic()
    answers = [served.call("/v1/chat/completions", served.limited_key, body) for _ in range(2 * REQUESTS_PER_MINUTE)]
    elapsed = time.monotonic() - started
    statuses = [a.status for a in answers]
    admitted = statuses.index(429) if 429 in statuses else len(statuses)
    assert set(statuses[:admitted]) == {200}, statuses
    refilled = elapsed * REQUESTS_PER_MINUTE / 60
    assert REQUESTS_PER_MINUTE <= admitted <= REQUESTS_PER_MINUTE + 1 + refilled, (statuses, elapsed)
    refused = answers[admitted]
    assert int(refused.headers["retry-after"]) >= 1, refused
    assert json.loads(refused.body)["error"]["code"] == "rate_limit_exceeded", refused
    limits = served.redis.client(LIMITS_DB)
    assert limits.exists(f"{REDIS_PREFIX}:key:limited:requests"), sorted(limits.keys("*"))
    # The admin key has its own budget: the limited key's refusal is not everyone's.
    assert served.call("/v1/chat/completions", served.key, body).status == 200
