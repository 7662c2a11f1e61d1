"""The Batch API through the `openai` SDK against in-process gateways (SQLite): the whole round trip,
the error file, low priority and the key's scope on each request, tenant isolation, cancelling, and the
answer without a database."""

from __future__ import annotations

import io
import json
import logging
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.batch import metrics as m
from servlane_gateway.batch.routes import MIN_UPLOAD_RATE, UPLOAD_GRACE_SECONDS, too_slow
from tests.support.batch import CHAT, KEYS, finished, gateway, jsonl_of, objects, request_line, submit
from tests.support.batch_databases import Postgres
from tests.support.gateway_harness import Gateway, StartGateway, Upstream
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.raw_http import read_response_head


def test_a_batch_runs_through_the_gateway_at_low_priority_and_bad_lines_go_to_the_error_file(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    client = gw.client("sk-alpha-00000000000000000000000")
    lines = [request_line(f"r{i}", f"hello {i}") for i in range(5)]
    lines += ["not json", request_line("r0"), request_line("x", "status=400"), request_line("m", model="missing")]
    seen_before = len(upstreams["v1"].state.headers)
    batch = submit(client, lines)
    assert batch.status == "validating"
    assert batch.endpoint == CHAT
    assert batch.completion_window == "24h"
    done = finished(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (9, 5, 4)
    assert done.completed_at is not None
    assert done.in_progress_at is not None
    output = jsonl_of(client, done.output_file_id)
    assert [o["custom_id"] for o in output] == [f"r{i}" for i in range(5)]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in output)
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "v1"
    errors = {
        (e["custom_id"], (e["error"] or {}).get("code") or e["response"]["status_code"])
        for e in jsonl_of(client, done.error_file_id)
    }
    assert errors == {(None, "invalid_json_line"), ("r0", "duplicate_custom_id"), ("x", 400), ("m", "model_not_found")}
    sent = upstreams["v1"].state.headers[seen_before:]
    assert len(sent) == 6
    assert all(h.get("x-priority") == "low" for h in sent)
    assert gw.sample(m.REQUESTS, feature="chat", outcome=m.SUCCEEDED) == 5
    assert gw.sample(m.REQUESTS, feature="chat", outcome=m.FAILED) == 1
    output_file = client.files.retrieve(done.output_file_id or "")
    assert output_file.purpose == "batch_output"
    listed = client.batches.list()
    assert [b.id for b in listed.data] == [batch.id]


def test_the_keys_scope_applies_to_each_line(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    client = gw.client("sk-narrow-0000000000000000000000")  # may call `chat` only
    done = finished(client, submit(client, [request_line("a"), request_line("b", model="other")]).id)
    assert done.status == "completed"
    assert [o["custom_id"] for o in jsonl_of(client, done.output_file_id)] == ["a"]
    [error] = jsonl_of(client, done.error_file_id)
    assert (error["custom_id"], error["error"]["code"]) == ("b", "model_not_found")


def test_another_key_sees_nothing_of_the_first_keys_files_and_batches(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    alpha, bravo = gw.client("sk-alpha-00000000000000000000000"), gw.client("sk-bravo-00000000000000000000000")
    batch = submit(alpha, [request_line("a")])
    done = finished(alpha, batch.id)
    for file_id in (batch.input_file_id, done.output_file_id or ""):
        with pytest.raises(openai.NotFoundError):
            bravo.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            bravo.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            bravo.files.delete(file_id)
        with pytest.raises(openai.NotFoundError):
            bravo.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        bravo.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bravo.batches.cancel(batch.id)
    assert bravo.files.list().data == []
    assert bravo.batches.list().data == []
    assert alpha.files.retrieve(batch.input_file_id).id == batch.input_file_id  # still there for its owner
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-nobody-0000000000000000000000").batches.list()


def test_a_cancelled_batch_stops_sending_and_keeps_what_was_answered(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_concurrency_per_feature=2)
    client = gw.client("sk-alpha-00000000000000000000000")
    batch = submit(client, [request_line(f"r{i}", "delay=0.2") for i in range(40)])
    wait_until(
        "some answers",
        lambda: (
            (
                client.batches.retrieve(batch.id).request_counts
                or openai.types.batch_request_counts.BatchRequestCounts(total=0, completed=0, failed=0)
            ).completed
            >= 2
        ),
        20,
    )
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = finished(client, batch.id)
    assert done.status == "cancelled"
    assert done.cancelled_at is not None
    assert done.request_counts is not None
    assert 2 <= done.request_counts.completed < 40
    assert len(jsonl_of(client, done.output_file_id)) == done.request_counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(submit_and_finish(client).id)


def submit_and_finish(client: openai.OpenAI) -> openai.types.Batch:
    done = finished(client, submit(client, [request_line("z")]).id)
    assert done.status == "completed"
    return done


def test_uploads_and_batches_are_checked(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_max_file_bytes=1000)
    client = gw.client("sk-alpha-00000000000000000000000")
    upload = client.files.create(file=("in.jsonl", io.BytesIO(b"x")), purpose="batch")
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 1001)), purpose="batch")
    assert caught.value.status_code == 413
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-nobody-0000000000000000000000").files.create(file=("in.jsonl", io.BytesIO(b"x")), purpose="batch")
    missing = httpx.post(
        f"{gw.url}/v1/files",
        data={"purpose": "batch"},
        headers={"authorization": "Bearer sk-alpha-00000000000000000000000"},
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "file"
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("in.jsonl", io.BytesIO(b"x")), purpose="assistants")
    # OpenAI's bounds on metadata (16 pairs, keys of 64, values of 512): unbounded, one tenant's filled the
    # database and came back on every list page.
    for metadata in ({"k" * 65: "v"}, {"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}):
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h", metadata=metadata)
    failed = finished(client, client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h").id)
    assert failed.status == "failed"
    assert failed.errors is not None
    assert failed.errors.data
    assert client.files.delete(upload.id).deleted


def test_without_a_database_the_batch_api_says_it_is_not_configured(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams), keys=KEYS)
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-wrong-00000000000000000000000").files.list()  # authentication first: nothing is served open
    calls: list[Callable[[openai.OpenAI], object]] = [
        lambda c: c.files.list(),
        lambda c: c.batches.retrieve("batch_x"),
        lambda c: c.batches.list(),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as caught:
            call(gw.client("sk-alpha-00000000000000000000000"))
        assert caught.value.code == "batch_api_not_configured"


def test_two_replicas_on_one_postgresql_share_a_batch_and_record_each_result_once(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, postgres: Postgres, tmp_path: Path
) -> None:
    url = postgres.new_database(f"replicas_{tmp_path.name[-20:].replace('-', '_').lower()}")
    replicas = [gateway(start_gateway, upstreams, tmp_path, batch_database_url=url, batch_concurrency_per_feature=2)
                for _ in range(2)]  # fmt: skip
    client = replicas[0].client("sk-alpha-00000000000000000000000")
    batch = submit(client, [request_line(f"r{i}", "delay=0.01") for i in range(200)])
    done = finished(
        replicas[1].client("sk-alpha-00000000000000000000000"), batch.id, timeout=60
    )  # either replica answers for it
    assert done.status == "completed"
    assert done.request_counts is not None
    assert done.request_counts.completed == 200
    output = jsonl_of(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"r{i}" for i in range(200))
    sent = [gw.sample(m.REQUESTS, feature="chat", outcome=m.SUCCEEDED) for gw in replicas]
    assert sum(sent) == 200, sent  # neither sent a request the other answered
    assert all(n > 0 for n in sent), sent  # both worked on it


def test_servlane_serve_gives_its_gateway_a_sqlite_database_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servlane_cli.supervisor import BATCH_DATABASE, ServeOptions, Supervisor

    monkeypatch.delenv("SERVLANE_GATEWAY_BATCH_DATABASE_URL", raising=False)
    supervisor = Supervisor(ServeOptions(inputs=[], state_dir=tmp_path, port=free_port()))
    expected = f"sqlite:///{tmp_path.resolve() / BATCH_DATABASE}"
    assert supervisor.gateway.env["SERVLANE_GATEWAY_BATCH_DATABASE_URL"] == expected
    assert supervisor.gateway.env["SERVLANE_GATEWAY_BATCH_ALLOW_WITHOUT_KEYS"] == "true"  # one user, no keys
    monkeypatch.setenv("SERVLANE_GATEWAY_BATCH_DATABASE_URL", "postgresql://db/batch")  # the user's own wins
    supervisor = Supervisor(ServeOptions(inputs=[], state_dir=tmp_path, port=free_port()))
    assert supervisor.gateway.env["SERVLANE_GATEWAY_BATCH_DATABASE_URL"] == "postgresql://db/batch"


def test_without_api_keys_the_batch_api_is_refused_unless_the_gateway_says_it_has_one_user(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    # Owners are keys: without keys every caller would be one owner, reading everyone's inputs and results.
    shared = start_gateway(objects(upstreams), batch_database_url=f"sqlite:///{tmp_path / 'a.db'}")
    calls: list[Callable[[openai.OpenAI], object]] = [
        lambda c: c.files.list(),
        lambda c: c.files.create(file=("in.jsonl", io.BytesIO(request_line("a").encode())), purpose="batch"),
        lambda c: c.files.content("file-x"),
        lambda c: c.batches.list(),
        lambda c: c.batches.retrieve("batch_x"),
    ]
    for call in calls:
        with pytest.raises(openai.PermissionDeniedError) as caught:
            call(shared.client("anything"))
        assert caught.value.code == "batch_api_needs_keys"
        assert "API keys" in caught.value.message
    assert shared.client("anything").chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])

    one_user = start_gateway(
        objects(upstreams),
        batch_database_url=f"sqlite:///{tmp_path / 'b.db'}",
        batch_poll_seconds=0.05,
        batch_allow_without_keys=True,
    )
    done = finished(one_user.client("anything"), submit(one_user.client("anything"), [request_line("a")]).id)
    assert done.status == "completed"
    assert [b.id for b in one_user.client("something-else").batches.list().data] == [done.id]  # one owner


def test_one_deeply_nested_line_is_its_own_error_and_stops_no_other_batch(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    alpha, bravo = gw.client("sk-alpha-00000000000000000000000"), gw.client("sk-bravo-00000000000000000000000")
    deep = json.dumps({"custom_id": "deep", "method": "POST", "url": CHAT, "body": "BODY"})
    deep = deep.replace('"BODY"', "[" * 100_000 + "]" * 100_000)
    hostile = submit(alpha, [deep, request_line("fine")])
    other = submit(bravo, [request_line("b")])
    assert finished(bravo, other.id).status == "completed"  # the other owner's batch is not held up
    done = finished(alpha, hostile.id)
    assert done.status == "completed"
    assert [o["custom_id"] for o in jsonl_of(alpha, done.output_file_id)] == ["fine"]
    [error] = jsonl_of(alpha, done.error_file_id)
    assert error["error"]["code"] == "too_deeply_nested"
    assert error["error"]["message"].startswith("Line 1: ")


def start_upload(gw: Gateway, key: str, file_bytes: int) -> socket.socket:
    """A chunked upload (no Content-Length) that has sent `file_bytes` of its file and neither more nor its
    end: whatever the gateway answers comes while the body is still incomplete."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    part = head + b"x" * file_bytes
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n\r\n".encode()
        + f"{len(part):x}\r\n".encode()
        + part
        + b"\r\n"
    )
    return sock


def chunked_upload_answer(gw: Gateway, key: str, file_bytes: int) -> bytes:
    with start_upload(gw, key, file_bytes) as sock:
        return read_response_head(sock)


def upload_status(client: openai.OpenAI) -> int:
    try:
        client.files.create(file=("in.jsonl", io.BytesIO(b"x")), purpose="batch")
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def test_slow_uploads_of_one_key_take_at_most_its_places_and_give_them_back(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_uploads_at_once=3, batch_uploads_at_once_per_key=2)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    bravo = gw.client("sk-bravo-00000000000000000000000")
    slow = [start_upload(gw, "sk-alpha-00000000000000000000000", 10) for _ in range(2)]
    try:
        wait_until("the slow uploads to hold the key's places", lambda: upload_status(alpha) == 503, 20)
        with pytest.raises(openai.InternalServerError) as caught:
            alpha.files.create(file=("in.jsonl", io.BytesIO(b"x")), purpose="batch")
        assert caught.value.code == "too_many_uploads"
        assert caught.value.response.headers["retry-after"] == "5"
        assert upload_status(bravo) == 200  # another key still has places
        slow.append(start_upload(gw, "sk-bravo-00000000000000000000000", 10))
        narrow = gw.client("sk-narrow-0000000000000000000000")
        wait_until("the replica's places to be all taken", lambda: upload_status(narrow) == 503, 20)
    finally:
        for sock in slow:
            sock.close()
    wait_until("the places to be given back", lambda: upload_status(alpha) == 200, 20)
    assert upload_status(narrow) == 200
    # A client that leaves mid-upload is no error of the gateway's: any client could flood the log with them.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_an_upload_that_trickles_is_cut_once_past_its_grace() -> None:
    """The server cuts a body that pauses for a minute, not one that trickles: a byte every 20 s held an upload
    place for good, and two keys holding theirs took every place of the replica from the other tenants."""
    too_slow(10, UPLOAD_GRACE_SECONDS)  # within the grace: anything goes
    too_slow(int(MIN_UPLOAD_RATE * 100), 100.0)  # at the least rate: fine
    with pytest.raises(OpenAIError) as cut:
        too_slow(int(MIN_UPLOAD_RATE * 100) - 1, 100.0)
    assert (cut.value.status, cut.value.code) == (408, "upload_too_slow")


def test_an_upload_past_the_cap_is_refused_as_it_arrives_whatever_content_length_says(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_max_file_bytes=1000)
    answer = chunked_upload_answer(
        gw, "sk-alpha-00000000000000000000000", 200_000
    )  # chunked: no Content-Length to check up front
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    head = b'--x\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    whole = httpx.post(
        f"{gw.url}/v1/files",
        content=iter([head, b"y" * 200_000, b"\r\n--x--\r\n"]),  # a generator: sent chunked, to its end
        headers={
            "authorization": "Bearer sk-alpha-00000000000000000000000",
            "content-type": "multipart/form-data; boundary=x",
        },
        timeout=20,
    )
    assert whole.status_code == 413
    assert whole.json()["error"]["code"] == "file_too_large"
    assert gw.client("sk-alpha-00000000000000000000000").files.list().data == []


def test_an_owner_cannot_upload_past_its_storage_quota(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_max_owner_bytes=1500)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    first = alpha.files.create(file=("a.jsonl", io.BytesIO(b"x" * 1000)), purpose="batch")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        alpha.files.create(file=("b.jsonl", io.BytesIO(b"x" * 1000)), purpose="batch")
    assert caught.value.code == "storage_quota_exceeded"
    assert "1000" in caught.value.message
    assert "1500" in caught.value.message
    gw.client("sk-bravo-00000000000000000000000").files.create(
        file=("b.jsonl", io.BytesIO(b"x" * 1000)), purpose="batch"
    )  # its own
    alpha.files.delete(first.id)
    alpha.files.create(file=("b.jsonl", io.BytesIO(b"x" * 1000)), purpose="batch")


def test_a_batch_is_refused_when_its_copy_of_the_input_would_pass_the_quota(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    """A batch keeps a copy of its input's lines until it ends: it counts, so one file cannot make batches
    without end (each a copy in the database every key shares)."""
    gw = gateway(start_gateway, upstreams, tmp_path, batch_max_owner_bytes=1500)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    content = "\n".join(request_line(f"r{i}") for i in range(8)).encode()
    assert 750 < len(content) <= 1500, len(content)
    stored = alpha.files.create(file=("a.jsonl", io.BytesIO(content)), purpose="batch")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        alpha.batches.create(input_file_id=stored.id, endpoint=CHAT, completion_window="24h")
    assert caught.value.code == "storage_quota_exceeded"
    assert caught.value.param == "input_file_id"
    assert "1500" in caught.value.message
    assert "batch" in caught.value.message
    assert alpha.batches.list().data == []


def test_answers_count_toward_the_quota_and_one_past_it_cancels_the_batch(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    """A batch's answers can be far larger than its input; recorded ones count before they are files, so one key
    cannot fill the database with them: the answer past the quota is an error line and the batch stops."""
    lines = [request_line(f"r{i}") for i in range(40)]
    content = "\n".join(lines).encode()
    gw = gateway(start_gateway, upstreams, tmp_path, batch_max_owner_bytes=2 * len(content) + 1500)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    batch = submit(alpha, lines)
    done = finished(alpha, batch.id)
    assert done.status == "cancelled", done
    assert done.errors is not None
    assert [e.code for e in done.errors.data or []] == ["storage_quota_exceeded"]
    output = jsonl_of(alpha, done.output_file_id) if done.output_file_id else []
    errors = jsonl_of(alpha, done.error_file_id)
    assert 1 <= len(output) < len(lines)
    assert {e["error"]["code"] for e in errors} == {"storage_quota_exceeded"}
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(output), len(errors))
    kept = sum(len(json.dumps(o, separators=(",", ":"))) + 1 for o in output)
    assert kept <= 1500  # what it kept of the answers fit beside the input and its copy


@pytest.mark.parametrize(
    ("path", "query", "code"),
    [
        ("/v1/batches", "limit=101", "integer_above_max_value"),
        ("/v1/batches", "limit=-1", "integer_below_min_value"),
        ("/v1/files", "limit=10001", "integer_above_max_value"),
        ("/v1/files", "order=sideways", "invalid_value"),
    ],
)
def test_a_list_outside_openais_bounds_is_a_400_naming_the_parameter(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path, path: str, query: str, code: str
) -> None:
    """They were clamped: a script asking 1000 got 100 and took it for all; -1 gave a page."""
    gw = gateway(start_gateway, upstreams, tmp_path)
    headers = {"authorization": "Bearer sk-alpha-00000000000000000000000"}
    answer = httpx.get(f"{gw.url}{path}?{query}", headers=headers, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, query.split("=")[0])


def test_a_list_with_limit_0_is_an_empty_last_page(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    submit(alpha, [request_line("r0")])
    assert len(alpha.batches.list(limit=100).data) == 1
    for page in (alpha.batches.list(limit=0), alpha.files.list(limit=0)):
        assert (page.data, page.has_more) == ([], False)


def test_no_secret_of_the_database_url_reaches_the_logs_when_it_does_not_answer(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = ("hunter2", "p4ssword", "k3ypass", "t0ken")
    nowhere = (
        f"postgresql://batch:hunter2@127.0.0.1:{free_port()}/batch"
        "?password=p4ssword&sslpassword=k3ypass&auth_token=t0ken&application_name=servlane"
    )
    caplog.set_level(logging.DEBUG)
    gw = start_gateway(objects(upstreams), keys=KEYS, batch_database_url=nowhere)
    with pytest.raises(openai.InternalServerError):
        gw.client("sk-alpha-00000000000000000000000").batches.list()
    wait_until("the failure to be logged", lambda: "is not usable" in caplog.text, 20)
    assert "application_name=servlane" in caplog.text  # the URL is there, to say which database
    leaked = [s for s in secrets if s in caplog.text]
    assert not leaked, caplog.text


def test_the_keys_quota_holds_for_batch_requests_which_wait_their_turn_instead_of_failing(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, key_max_in_flight=1, batch_concurrency_per_feature=3)
    client = gw.client("sk-alpha-00000000000000000000000")
    done = finished(client, submit(client, [request_line(f"r{i}", "delay=0.1") for i in range(6)]).id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 0)
    assert gw.sample(m.REQUESTS, feature="chat", outcome=m.RETRIED) > 0  # refused 429 by the in-flight cap
    assert gw.sample("servlane_gateway_requests_total", feature="chat", model="", code="429") > 0


def test_a_database_that_does_not_answer_leaves_the_gateway_serving_and_the_batch_api_saying_try_later(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/batch"  # nothing listens there
    gw = start_gateway(objects(upstreams), keys=KEYS, batch_database_url=nowhere)
    client = gw.client("sk-alpha-00000000000000000000000")
    assert client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}]).choices
    with pytest.raises(openai.InternalServerError) as caught:
        client.batches.list()
    assert caught.value.status_code == 503
    assert caught.value.code == "batch_api_unavailable"
    assert caught.value.response.headers["retry-after"] == "5"


def test_the_console_shows_a_keys_own_batches_with_their_progress(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    alpha = gw.client("sk-alpha-00000000000000000000000")
    done = finished(alpha, submit(alpha, [request_line(f"r{i}") for i in range(4)] + ["not json"]).id)
    assert done.status == "completed"

    def console_batches(key: str) -> Any:
        response = httpx.get(f"{gw.url}/console/api/state", headers={"authorization": f"Bearer {key}"}, timeout=10)
        assert response.status_code == 200
        return response.json()["batches"]

    (shown,) = console_batches("sk-alpha-00000000000000000000000")
    assert (shown["id"], shown["status"], shown["endpoint"]) == (done.id, "completed", CHAT)
    assert (shown["total"], shown["completed"], shown["failed"]) == (5, 4, 1)
    assert shown["requestsPerMinute"] > 0
    assert console_batches("sk-bravo-00000000000000000000000") == []  # another key's batches are not its business

    plain = start_gateway(objects(upstreams), keys=KEYS)  # no database: the console says the Batch API is off
    response = httpx.get(
        f"{plain.url}/console/api/state",
        headers={"authorization": "Bearer sk-alpha-00000000000000000000000"},
        timeout=10,
    )
    assert response.json()["batches"] is None


def form(*parts: tuple[str, str | None, bytes], boundary: str = "bnd") -> bytes:
    body = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


def test_uploads_are_parsed_as_they_arrive_and_a_refused_one_leaves_nothing_stored(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    key = "sk-alpha-00000000000000000000000"

    def post(body: bytes, content_type: str = "multipart/form-data; boundary=bnd") -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", "content-type": content_type}
        return httpx.post(f"{gw.url}/v1/files", content=body, headers=headers, timeout=20)

    content = "\n".join(request_line(f"r{i}") for i in range(3)).encode()
    file_first = post(form(("file", "in.jsonl", content), ("purpose", None, b"batch")))  # any order
    assert file_first.status_code == 200, file_first.text
    assert file_first.json()["filename"] == "in.jsonl"
    assert gw.client(key).files.content(file_first.json()["id"]).content == content
    refused = [
        post(form(("purpose", None, b"batch"), ("file", "a.jsonl", b"{}"), ("file", "b.jsonl", b"{}"))),
        post(form(("file", "a.jsonl", b"{}"), ("purpose", None, b"assistants"))),
        post(form(("file", "a.jsonl", b"{}"))),  # no purpose
        post(form(("purpose", None, b"batch" * 1000), ("file", "a.jsonl", b"{}"))),  # a field past its size
        post(b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\ncut short'),
        post(b"purpose=batch", "application/x-www-form-urlencoded"),
        post(form(*[("purpose", None, b"batch")] * 9, ("file", "a.jsonl", b"{}"))),  # too many parts
        post(form(("purpose", None, b"batch"), ("file", "n" * 513, b"{}"))),  # a name past its column
    ]
    assert [r.status_code for r in refused] == [400] * len(refused), [r.text for r in refused]
    assert all(r.json()["error"]["type"] == "invalid_request_error" for r in refused)
    assert [f.id for f in gw.client(key).files.list().data] == [file_first.json()["id"]]
    with sqlite3.connect(tmp_path / "batch.db") as db:  # the refused uploads' rows and chunks are gone too
        assert db.execute("SELECT count(*) FROM batch_files").fetchone() == (1,)
        assert db.execute("SELECT count(DISTINCT file_id) FROM batch_file_chunks").fetchone() == (1,)


def test_a_malformed_upload_is_a_400_and_writes_nothing_to_the_log(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """python-multipart logged a warning per malformed part header: any caller could fill the gateway's log."""
    gw = gateway(start_gateway, upstreams, tmp_path)
    body = b'--b\r\nContent-Dis[position: form-data; name="file"\r\n\r\nx\r\n--b--\r\n'
    headers = {
        "authorization": "Bearer sk-alpha-00000000000000000000000",
        "content-type": "multipart/form-data; boundary=b",
    }
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            answer = httpx.post(gw.url + "/v1/files", content=body, headers=headers, timeout=10)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_multipart", answer.text
    assert [r.getMessage() for r in caplog.records if r.name.startswith("python_multipart")] == []


def announced_body_answer(gw: Gateway, path: str, authorization: str | None, length: int) -> bytes:
    """The gateway's answer to a POST that announces a JSON body of `length` bytes and sends none of it."""
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        auth = f"Authorization: {authorization}\r\n" if authorization else ""
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: gw\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        return read_response_head(sock)


def test_a_batch_is_refused_before_its_body_is_read_without_a_key_and_capped_with_one(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    """FastAPI read and parsed a batch's body before the handler checked the key, with no cap: any caller could
    have the gateway read a body of any size, and a key's holder could send one. Now the key comes first, as on
    every other endpoint, and the body is capped at maxBodyBytes."""
    gw = gateway(start_gateway, upstreams, tmp_path, max_body_bytes=10_000)
    for authorization in (None, "Bearer sk-wrong-000000000000000000000000"):
        refused = announced_body_answer(gw, "/v1/batches", authorization, 64 << 20)  # answered, body unsent
        as_files = announced_body_answer(gw, "/v1/files", authorization, 64 << 20)
        assert refused.split(b"\r\n")[0] == as_files.split(b"\r\n")[0], (refused[:200], as_files[:200])
        assert refused.startswith((b"HTTP/1.1 401", b"HTTP/1.1 403")), refused[:200]
    key = "Bearer sk-alpha-00000000000000000000000"
    assert announced_body_answer(gw, "/v1/batches", key, 10_001).startswith(b"HTTP/1.1 413")
    padded = json.dumps({"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "24h", "pad": "x" * 20_000})
    chunked = httpx.post(
        f"{gw.url}/v1/batches",
        content=iter([padded.encode()]),  # a generator: sent chunked, no Content-Length to check up front
        headers={"authorization": key, "content-type": "application/json"},
        timeout=10,
    )
    assert chunked.status_code == 413, chunked.text
    assert chunked.json()["error"]["type"] == "invalid_request_error"
    # Within the cap, as before: parsed, each field checked in OpenAI's shape.
    alpha = gw.client("sk-alpha-00000000000000000000000")
    with pytest.raises(openai.BadRequestError) as bad:
        alpha.batches.create(input_file_id="file-x", endpoint=CHAT, completion_window=24)  # type: ignore[arg-type]
    assert bad.value.param == "completion_window"
    broken = httpx.post(f"{gw.url}/v1/batches", content=b"{", headers={"authorization": key}, timeout=10)
    assert broken.status_code == 400, broken.text
    with pytest.raises(openai.NotFoundError):
        alpha.batches.create(input_file_id="file-x", endpoint=CHAT, completion_window="24h")
