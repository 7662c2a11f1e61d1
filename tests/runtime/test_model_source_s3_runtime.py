"""The runtime process (`python -m servlane_runtime`, as a pod runs it) with an s3:// source on a real store.

It serves the tiny model fetched from SeaweedFS; two runtimes started at once on one cache dir fetch each file
once (counted in the store's own log); and every way the source can fail ends the process within seconds with
MODEL_SOURCE_FAILED and a termination message that starts with the source and quotes the store, free of the
credentials.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import MODEL_SOURCE_FAILED
from servlane_api.s3_source import S3Settings
from tests.support import s3_server as s3_fixtures
from tests.support.s3_server import READER_BUCKET, Keys, S3Server, StallingProxy
from tests.support.servers import SubprocessServer, tiny_config

s3_server = s3_fixtures.s3_server  # the module's SeaweedFS

BUCKET = "runtime-models"
PREFIX = "tiny/llama"
SOURCE = f"s3://{BUCKET}/{PREFIX}"
# A runtime that cannot have its model must say so this fast (its own start, imports included, counts).
FAILURE_DEADLINE_SECONDS = 30


@pytest.fixture(scope="module")
def uploaded(s3_server: S3Server, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    keys = s3_server.upload_dir(tiny_llama_dir, BUCKET, PREFIX)
    # A prefix that holds files but no model (no config.json), and the reader's bucket, empty.
    no_model = tmp_path_factory.mktemp("not-a-model")
    (no_model / "tokenizer.json").write_bytes((tiny_llama_dir / "tokenizer.json").read_bytes())
    s3_server.upload_dir(no_model, BUCKET, "not-a-model")
    s3_server.make_bucket(READER_BUCKET)
    return keys


def s3_config(endpoint: str, cache_dir: Path, source: str = SOURCE, stall: float = 60) -> RuntimeConfig:
    settings = S3Settings(endpoint=endpoint, region="us-east-1", path_style=True, stall_timeout_seconds=stall)
    return tiny_config(Path("/unused"), model_source=source, s3=settings, cache_dir=str(cache_dir))


def test_the_runtime_serves_the_model_from_s3(s3_server: S3Server, uploaded: list[str], tmp_path: Path) -> None:
    config = s3_config(s3_server.endpoint, tmp_path / "cache")
    with SubprocessServer(config, s3_server.admin.env()) as server:
        server.wait_ready(timeout=180)
        response = httpx.post(
            f"{server.v1}/chat/completions",
            json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        log = server.log()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] is not None
    assert s3_server.admin.secret_key not in log


def test_two_runtimes_started_at_once_on_one_cache_fetch_each_file_once(
    s3_server: S3Server, uploaded: list[str], tmp_path: Path
) -> None:
    before = s3_server.object_gets(BUCKET)
    config = s3_config(s3_server.endpoint, tmp_path / "shared-cache")
    with ExitStack() as stack:
        servers = [
            stack.enter_context(SubprocessServer(config, s3_server.admin.env(), wait_for_health=False))
            for _ in range(2)
        ]
        for server in servers:
            server.wait_ready(timeout=240)
        logs = [server.log() for server in servers]
    gets = s3_server.object_gets(BUCKET)[len(before) :]
    assert sorted(gets) == sorted(uploaded), gets  # each file once, though two runtimes started
    # One of them fetched; the other waited for it on the cache's lock and fetched nothing.
    assert sum("fetched 6 of 6 files" in log for log in logs) == 1, logs
    assert sum("nothing to fetch" in log for log in logs) == 1, logs


WRONG_KEYS = Keys("AKNOSUCHKEY0001", "not-the-secret-of-anyone-at-all")


@pytest.mark.parametrize(
    ("source", "who", "quoted"),
    [
        (SOURCE, "wrong", "InvalidAccessKeyId: "),
        (SOURCE, "reader", "AccessDenied: "),
        ("s3://no-such-bucket/tiny/llama", "admin", "NoSuchBucket: "),
        (f"s3://{BUCKET}/no/such/model", "admin", "no object under this prefix"),
        (f"s3://{BUCKET}/not-a-model", "admin", "not a model: no config.json"),
    ],
    ids=["wrong-credentials", "no-permission", "missing-bucket", "missing-prefix", "not-a-model"],
)
def test_a_source_that_fails_ends_the_runtime_in_seconds_with_the_stores_words(
    s3_server: S3Server, uploaded: list[str], tmp_path: Path, source: str, who: str, quoted: str
) -> None:
    keys = {"wrong": WRONG_KEYS, "reader": s3_server.reader, "admin": s3_server.admin}[who]
    config = s3_config(s3_server.endpoint, tmp_path / "cache", source=source)
    _assert_fails_fast(config, keys, source, quoted)


def test_a_stalled_transfer_ends_the_runtime_in_seconds(
    s3_server: S3Server, uploaded: list[str], tmp_path: Path
) -> None:
    upstream = ("127.0.0.1", int(s3_server.endpoint.rsplit(":", 1)[1]))
    with StallingProxy(upstream, budget=300_000) as proxy:
        config = s3_config(proxy.endpoint, tmp_path / "cache", stall=2)
        _assert_fails_fast(config, s3_server.admin, f"{SOURCE}/model.safetensors", "stalled: no data for 2s")


def _assert_fails_fast(config: RuntimeConfig, keys: Keys, source: str, quoted: str) -> None:
    started = time.monotonic()
    with SubprocessServer(config, keys.env(), wait_for_health=False) as server:
        code = server.exit_code_within(FAILURE_DEADLINE_SECONDS + 30)
        took = time.monotonic() - started
        log, message = server.log(), server.termination_log.read_text()
    assert code == MODEL_SOURCE_FAILED, log
    assert took < FAILURE_DEADLINE_SECONDS, f"took {took:.1f}s to end"
    assert message.startswith(f"{source}: "), message
    assert quoted in message, message
    assert message.count("\n") == 1
    # The termination message is copied into the pod's status, readable by anyone who can read pods.
    assert keys.secret_key not in message
    assert keys.secret_key not in log
