"""The Batch API's store against SQLite and a real PostgreSQL: migrations, owners, claims with leases,
results recorded exactly once, finalization into output and error files."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import column, func, insert, inspect, select, text
from sqlalchemy import table as sa_table
from sqlalchemy.exc import DBAPIError

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.batch import rules
from servlane_gateway.batch import store as store_module
from servlane_gateway.batch.files import ABANDONED_AFTER, FILE_CHUNK, FileGone, QuotaExceeded, engine_url, redacted
from servlane_gateway.batch.routes import in_db
from servlane_gateway.batch.schema import file_chunks, files
from servlane_gateway.batch.store import BatchStore
from tests.support.batch_databases import Postgres

CHAT = "/v1/chat/completions"
LEASE = 30.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'batch.db'}"
    else:
        server: Postgres = request.getfixturevalue("postgres")
        url = server.new_database(f"t_{uuid.uuid4().hex[:12]}")
    db = BatchStore(url)
    db.migrate()
    yield db
    db.close()


def jsonl(*custom_ids: str, bad: int = 0) -> bytes:
    lines = [
        json.dumps({"custom_id": c, "method": "POST", "url": CHAT, "body": {"model": "chat", "messages": []}})
        for c in custom_ids
    ]
    return "\n".join(lines + ["not json"] * bad).encode()


def started(db: BatchStore, owner: str, content: bytes, now: int = 1000) -> str:
    """A batch of `owner`, validated and in progress."""
    file = db.add_file(owner, "batch", "in.jsonl", content, now)
    batch = db.create_batch(owner, file["id"], CHAT, "24h", {"k": "v"}, now)
    claimed = db.claim_validation("validator", now, LEASE)
    assert claimed is not None
    assert claimed["id"] == batch["id"]
    assert b"".join(db.file_chunks(owner, claimed["input_file_id"])) == content
    validated = rules.validate(db.file_chunks(owner, claimed["input_file_id"]), CHAT, lambda _m: True)
    assert db.finish_validation(batch["id"], "validator", validated, now) == rules.IN_PROGRESS
    return str(batch["id"])


def ok_line(custom_id: str) -> dict[str, object]:
    return rules.response_line("batch_req_x", custom_id, 200, "r", {"choices": []})


def test_migrations_create_the_tables_and_running_them_again_changes_nothing(store: BatchStore) -> None:
    store.migrate()
    tables = set(inspect(store.engine).get_table_names())
    assert {"batch_files", "batches", "batch_requests", "batch_line_errors", "servlane_batch_alembic_version"} <= tables


def test_sizes_past_2_gib_are_stored(store: BatchStore) -> None:
    """A batch's output file, or a quota's worth of results, can pass PostgreSQL's INTEGER (migration 0004)."""
    size = 3 << 30
    with store.engine.begin() as conn:
        values = {"owner": "o", "purpose": "batch_output", "filename": "out.jsonl", "created_at": 1}
        conn.execute(insert(files).values(id="file-big", bytes=size, **values))
    assert store.get_file("o", "file-big")["bytes"] == size  # type: ignore[index]


def test_files_and_batches_are_only_their_owners(store: BatchStore) -> None:
    file = store.add_file("team-a", "batch", "in.jsonl", b"{}", 1)
    batch = store.create_batch("team-a", file["id"], CHAT, "24h", None, 1)
    assert store.get_file("team-a", file["id"]) == file
    assert store.get_file("team-b", file["id"]) is None
    assert store.file_content("team-b", file["id"]) is None
    assert store.list_files("team-b", None, None, 10, False) == ([], False)
    assert store.get_batch("team-b", batch["id"]) is None
    assert store.list_batches("team-b", None, 10) == ([], False)
    assert store.cancel_batch("team-b", batch["id"], 2) is None
    assert store.delete_file("team-b", file["id"]) is False
    assert store.file_content("team-a", file["id"]) == b"{}"
    assert store.get_batch("team-a", batch["id"])["status"] == rules.VALIDATING  # type: ignore[index]
    assert store.delete_file("team-a", file["id"]) is True
    assert store.get_file("team-a", file["id"]) is None


def test_lists_page_newest_first(store: BatchStore) -> None:
    ids = [store.add_file("o", "batch", f"{i}.jsonl", b"x", 100 + i)["id"] for i in range(5)]
    page, more = store.list_files("o", "batch", None, 2, False)
    assert [f["id"] for f in page] == ids[::-1][:2]
    assert more
    page, more = store.list_files("o", None, page[-1]["id"], 10, False)
    assert [f["id"] for f in page] == ids[::-1][2:]
    assert not more
    page, _ = store.list_files("o", None, None, 10, True)
    assert [f["id"] for f in page] == ids


def test_validation_records_the_requests_and_the_bad_lines(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a", "b", "c", bad=2))
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["status"] == rules.IN_PROGRESS
    assert batch["in_progress_at"] == 1000
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 2}
    assert batch["metadata"] == {"k": "v"}
    assert store.claim_validation("other", 1001, LEASE) is None  # nothing left to validate


def test_an_unusable_file_fails_the_batch_with_errors(store: BatchStore) -> None:
    file = store.add_file("o", "batch", "in.jsonl", b"nothing useful", 1)
    batch = store.create_batch("o", file["id"], CHAT, "24h", None, 1)
    claimed = store.claim_validation("w", 1, LEASE)
    assert claimed is not None
    assert store.finish_validation(batch["id"], "w", rules.validate(b"nothing useful", CHAT, lambda _m: True), 2)
    failed = store.get_batch("o", batch["id"])
    assert failed is not None
    assert failed["status"] == rules.FAILED
    assert failed["failed_at"] == 2
    assert failed["errors"]["data"][0]["code"] == "invalid_file"


def test_a_validation_whose_worker_died_is_taken_over_after_its_lease(store: BatchStore) -> None:
    file = store.add_file("o", "batch", "in.jsonl", jsonl("a"), 1)
    batch = store.create_batch("o", file["id"], CHAT, "24h", None, 1)
    assert store.claim_validation("dead", 10, LEASE) is not None
    assert store.claim_validation("alive", 10 + LEASE / 2, LEASE) is None
    assert store.claim_validation("alive", 10 + LEASE, LEASE) is not None
    validated = rules.validate(jsonl("a"), CHAT, lambda _m: True)
    assert store.finish_validation(batch["id"], "dead", validated, 50) is None  # too late: no longer its
    assert store.finish_validation(batch["id"], "alive", validated, 50) == rules.IN_PROGRESS


def test_claims_are_exclusive_until_their_lease_runs_out(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl(*"abcde"))
    first = store.claim_requests(batch_id, "w1", 2000, LEASE, 3)
    second = store.claim_requests(batch_id, "w2", 2000, LEASE, 10)
    assert [c.custom_id for c in first] == ["a", "b", "c"]
    assert [c.custom_id for c in second] == ["d", "e"]
    assert store.claim_requests(batch_id, "w3", 2000 + LEASE / 2, LEASE, 10) == []
    store.renew("w1", [(batch_id, first[0].line)], 2000 + LEASE / 2, LEASE)  # w1 is still sending "a"
    retaken = store.claim_requests(batch_id, "w3", 2000 + LEASE, LEASE, 10)
    assert sorted(c.custom_id for c in retaken) == ["b", "c", "d", "e"]
    assert all(c.attempts == 2 for c in retaken)


def test_a_result_is_recorded_once_whoever_answers_last(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a", "b"))
    dead = store.claim_requests(batch_id, "dead", 2000, LEASE, 10)
    again = store.claim_requests(batch_id, "alive", 2000 + LEASE, LEASE, 10)
    assert [c.line for c in dead] == [c.line for c in again]
    assert store.record(batch_id, again[0].line, ok_line("a"), ok=True)
    assert not store.record(batch_id, dead[0].line, ok_line("a"), ok=True)  # the late duplicate is dropped
    assert store.get_batch("o", batch_id)["request_counts"]["completed"] == 1  # type: ignore[index]
    assert store.try_finalize(batch_id, 2100) is None  # "b" is not answered yet


def test_a_finished_batch_gets_one_output_line_per_custom_id_and_an_error_file(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a", "b", "c", bad=1))
    claimed = store.claim_requests(batch_id, "w", 2000, LEASE, 10)
    for c in claimed[:2]:
        assert store.record(batch_id, c.line, ok_line(c.custom_id), ok=True)
    failed = rules.response_line("batch_req_y", "c", 400, "r", {"error": {"message": "bad"}})
    assert store.record(batch_id, claimed[2].line, failed, ok=False)
    assert store.try_finalize(batch_id, 2001) == rules.COMPLETED
    assert store.try_finalize(batch_id, 2002) is None  # once only
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["status"] == rules.COMPLETED
    assert batch["completed_at"] == 2001
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    output = store.file_content("o", batch["output_file_id"])
    errors = store.file_content("o", batch["error_file_id"])
    assert output is not None
    assert errors is not None
    assert [json.loads(x)["custom_id"] for x in output.splitlines()] == ["a", "b"]
    error_lines = [json.loads(x) for x in errors.splitlines()]
    assert error_lines[0]["response"]["status_code"] == 400
    assert error_lines[1]["custom_id"] is None
    assert error_lines[1]["error"]["code"] == "invalid_json_line"
    assert store.get_file("o", batch["output_file_id"])["purpose"] == "batch_output"  # type: ignore[index]


def test_an_expired_batch_puts_its_unanswered_requests_in_the_error_file(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a", "b"))
    claimed = store.claim_requests(batch_id, "w", 2000, LEASE, 1)
    assert store.record(batch_id, claimed[0].line, ok_line("a"), ok=True)
    expires = store.get_batch("o", batch_id)["expires_at"]  # type: ignore[index]
    assert store.try_finalize(batch_id, expires - 1) is None
    assert store.try_finalize(batch_id, expires) == rules.EXPIRED
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    errors = store.file_content("o", batch["error_file_id"])
    assert errors is not None
    assert json.loads(errors)["error"]["code"] == "batch_expired"
    assert store.claim_requests(batch_id, "w", expires + 1, LEASE, 10) == []
    assert not store.record(batch_id, claimed[0].line + 1, ok_line("b"), ok=True)  # a late answer for "b"
    assert store.get_batch("o", batch_id)["request_counts"]["completed"] == 1  # type: ignore[index]


def test_cancelling_waits_for_requests_in_flight_then_keeps_what_was_answered(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a", "b", "c"))
    claimed = store.claim_requests(batch_id, "w", 2000, LEASE, 2)
    cancelling = store.cancel_batch("o", batch_id, 2001)
    assert cancelling is not None
    assert cancelling["status"] == rules.CANCELLING
    assert store.claim_requests(batch_id, "w2", 2002, LEASE, 10) == []  # nothing more is sent
    assert store.try_finalize(batch_id, 2002) is None  # "a" and "b" are still in flight
    assert store.record(batch_id, claimed[0].line, ok_line("a"), ok=True)
    store.retry_later(batch_id, claimed[1].line, "w", 2002)  # given back unsent
    assert store.try_finalize(batch_id, 2003) == rules.CANCELLED
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["cancelled_at"] == 2003
    assert batch["error_file_id"] is None
    assert store.file_content("o", batch["output_file_id"]).count(b"\n") == 1  # type: ignore[union-attr]
    assert store.cancel_batch("o", batch_id, 2004)["status"] == rules.CANCELLED  # type: ignore[index]
    assert not store.record(batch_id, claimed[1].line, ok_line("b"), ok=True)  # a late answer changes nothing
    assert store.get_batch("o", batch_id)["request_counts"]["completed"] == 1  # type: ignore[index]


def test_a_finished_batch_cannot_be_cancelled(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl("a"))
    claimed = store.claim_requests(batch_id, "w", 2000, LEASE, 1)
    assert store.record(batch_id, claimed[0].line, ok_line("a"), ok=True)
    assert store.try_finalize(batch_id, 2001) == rules.COMPLETED
    with pytest.raises(rules.TransitionError, match="completed cannot become cancelling"):
        store.cancel_batch("o", batch_id, 2002)


def test_concurrent_claimers_never_share_a_request(store: BatchStore) -> None:
    batch_id = started(store, "o", jsonl(*(f"r{i}" for i in range(200))))
    got: dict[str, list[int]] = {}

    def claim(me: str) -> None:
        mine = got.setdefault(me, [])
        while batch := store.claim_requests(batch_id, me, 2000, LEASE, 7):
            mine += [c.line for c in batch]

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [line for lines in got.values() for line in lines]
    assert sorted(every) == list(range(1, 201))


def test_database_urls() -> None:
    assert engine_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert engine_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert engine_url("sqlite:///x.db") == "sqlite:///x.db"
    assert "s3cret" not in redacted("postgresql://u:s3cret@h/db")


def test_redacted_urls_keep_no_secret_in_the_userinfo_nor_the_query() -> None:
    url = (
        "postgresql://u:s3cret@h:5432/db?sslmode=require&password=p4ss&sslpassword=k3y-pass"
        "&auth_token=t0ken&client_secret=c1ient&sslkey=/etc/k.pem"
    )
    shown = redacted(url)
    for secret in ("s3cret", "p4ss", "k3y-pass", "t0ken", "c1ient", "/etc/k.pem", "k.pem"):
        assert secret not in shown, shown
    assert "sslmode=require" in shown  # what is not secret still helps whoever reads the log
    assert "h:5432/db" in shown


def test_an_owner_cannot_store_past_its_quota_and_result_files_count(tmp_path: Path) -> None:
    db = BatchStore(f"sqlite:///{tmp_path / 'quota.db'}", max_owner_bytes=1000)
    db.migrate()
    try:
        kept = db.add_file("team-a", "batch", "a.jsonl", b"x" * 600, 1)
        with pytest.raises(QuotaExceeded) as caught:
            db.add_file("team-a", "batch", "b.jsonl", bytearray(b"x" * 401), 2)
        assert (caught.value.used, caught.value.size, caught.value.quota) == (600, 401, 1000)
        db.add_file("team-b", "batch", "b.jsonl", b"x" * 1000, 3)  # another owner's quota is its own
        db.add_file("team-a", "batch", "c.jsonl", b"x" * 400, 4)  # exactly up to it
        assert db.delete_file("team-a", kept["id"])
        db.add_file("team-a", "batch", "d.jsonl", b"x" * 600, 5)  # deleting frees room
    finally:
        db.close()


def test_each_unfinished_batch_counts_its_copy_of_the_input_and_the_copy_goes_when_it_ends(store: BatchStore) -> None:
    """One stored file made any number of batches, each a copy of its lines in the database all share, kept for
    ever with their results: the copies count toward the quota until the batch ends, and go then."""
    content = jsonl("a", "b", bad=1)
    quota = 3 * len(content) - 1  # room for the file and one copy, not two
    store.max_owner_bytes = quota
    batch_id = started(store, "o", content)  # the file and one copy
    file_id = store.get_batch("o", batch_id)["input_file_id"]  # type: ignore[index]
    with pytest.raises(QuotaExceeded) as caught:  # a second copy would pass the quota
        store.create_batch("o", file_id, CHAT, "24h", None, 1001)
    assert (caught.value.used, caught.value.size, caught.value.quota) == (2 * len(content), len(content), quota)
    with pytest.raises(QuotaExceeded):  # an upload counts the copy too
        store.add_file("o", "batch", "more.jsonl", content, 1001)
    other = store.add_file("p", "batch", "in.jsonl", content, 1001)
    store.create_batch("p", other["id"], CHAT, "24h", None, 1001)  # another owner's quota is its own
    assert store.delete_file("o", file_id)  # the copy stays, and counts, without the file
    with pytest.raises(QuotaExceeded):
        store.add_file("o", "batch", "more.jsonl", content + content, 1002)
    with pytest.raises(FileGone):  # a deleted file makes no batch
        store.create_batch("o", file_id, CHAT, "24h", None, 1002)

    for claimed in store.claim_requests(batch_id, "w", 2000, LEASE, 10):
        assert store.record(batch_id, claimed.line, ok_line(claimed.custom_id), ok=True)
    assert store.try_finalize(batch_id, 2001) == rules.COMPLETED
    with store.engine.connect() as conn:  # its lines and results are in its files now
        for name in ("batch_requests", "batch_line_errors"):
            left = conn.execute(text(f"SELECT count(*) FROM {name} WHERE batch_id = :b"), {"b": batch_id}).scalar()
            assert left == 0, name
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    results = sum(store.get_file("o", batch[key])["bytes"] for key in ("output_file_id", "error_file_id"))  # type: ignore[index]
    store.add_file("o", "batch", "next.jsonl", b"x" * (quota - results), 2002)  # the copy freed its room


def test_results_count_as_they_are_recorded_and_one_past_the_quota_cancels_the_batch(store: BatchStore) -> None:
    """A batch's answers can be far larger than its input (each line's max_tokens): they count toward the owner's
    quota as they accrue, and the answer that would pass it is not kept; the batch stops there, saying why."""
    content = jsonl("a", "b", "c")
    answer = rules.json_line(ok_line("a")).encode() + b"\n"
    store.max_owner_bytes = 2 * len(content) + len(answer) + len(answer) // 2  # the file, its copy, one answer
    batch_id = started(store, "o", content)
    first, second, _third = store.claim_requests(batch_id, "w", 2000, LEASE, 10)
    assert store.record(batch_id, first.line, ok_line("a"), ok=True, now=2000)
    with pytest.raises(QuotaExceeded) as caught:  # the recorded answer counts before it is in a file
        store.add_file("o", "batch", "x.jsonl", b"x" * (len(answer) // 2 + 1), 2000)
    assert caught.value.used == 2 * len(content) + len(answer)
    store.add_file("p", "batch", "x.jsonl", b"x" * len(answer), 2000)  # another owner's quota is its own

    assert store.record(batch_id, second.line, ok_line("b"), ok=True, now=2001)  # past the quota: not kept
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert (batch["status"], batch["cancelling_at"]) == (rules.CANCELLING, 2001)
    assert [e["code"] for e in batch["errors"]["data"]] == [rules.QUOTA_EXCEEDED]
    assert store.claim_requests(batch_id, "w2", 2000 + LEASE + 1, LEASE, 10) == []  # nothing more is sent
    assert store.try_finalize(batch_id, 2000 + LEASE + 1) == rules.CANCELLED  # once the last lease is over

    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert batch["request_counts"] == {"total": 3, "completed": 1, "failed": 1}
    output = b"".join(store.file_chunks("o", batch["output_file_id"])).decode().splitlines()
    assert [json.loads(line)["custom_id"] for line in output] == ["a"]
    errors = [json.loads(line) for line in b"".join(store.file_chunks("o", batch["error_file_id"])).splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("b", rules.QUOTA_EXCEEDED)]
    assert "quota" in errors[0]["error"]["message"]


def test_a_result_without_a_quota_is_recorded_whole(store: BatchStore) -> None:
    big = rules.response_line("batch_req_x", "a", 200, "r", {"choices": [{"text": "x" * 100_000}]})
    batch_id = started(store, "o", jsonl("a"))
    (claimed,) = store.claim_requests(batch_id, "w", 2000, LEASE, 10)
    assert store.record(batch_id, claimed.line, big, ok=True)
    assert store.try_finalize(batch_id, 2001) == rules.COMPLETED
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    assert json.loads(b"".join(store.file_chunks("o", batch["output_file_id"]))) == big


def test_pg_uploads_of_one_owner_at_once_cannot_both_pass_the_quota(postgres: Postgres) -> None:
    db = BatchStore(postgres.new_database(f"q_{uuid.uuid4().hex[:12]}"), max_owner_bytes=1000)
    db.migrate()
    outcomes: list[str] = []

    def upload() -> None:
        try:
            db.add_file("team-a", "batch", "in.jsonl", b"x" * 600, 1)
            outcomes.append("stored")
        except QuotaExceeded:
            outcomes.append("refused")

    try:
        threads = [threading.Thread(target=upload) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(outcomes) == ["refused"] * 5 + ["stored"]
    finally:
        db.close()


def test_a_file_is_stored_and_read_back_in_chunks_of_its_owner(store: BatchStore) -> None:
    content = bytes(range(256)) * (FILE_CHUNK // 256) * 2 + b"tail"  # two whole chunks and a bit
    file = store.add_file("o", "batch", "in.jsonl", content, 1)
    with store.engine.connect() as conn:
        sizes = conn.execute(
            select(func.length(file_chunks.c.data))
            .where(file_chunks.c.file_id == file["id"])
            .order_by(file_chunks.c.idx)
        ).scalars()
        assert list(sizes) == [FILE_CHUNK, FILE_CHUNK, 4]
    assert b"".join(store.file_chunks("o", file["id"])) == content
    assert store.file_chunk("o", file["id"], 3) is None  # past the end
    assert store.file_chunk("other", file["id"], 0) is None  # another owner's: as missing
    assert list(store.file_chunks("other", file["id"])) == []


def test_an_upload_in_progress_is_nobodys_until_finished_and_an_abandoned_one_is_swept(store: BatchStore) -> None:
    receiving = store.begin_file("o", "batch", "in.jsonl", 1)
    store.append_chunk(receiving, 0, b"part")
    assert store.get_file("o", receiving) is None
    assert store.list_files("o", None, None, 10, False)[0] == []
    assert store.file_chunk("o", receiving, 0) is None
    assert not store.delete_file("o", receiving)
    finished = store.finish_file("o", receiving, 4)
    assert finished["bytes"] == 4
    assert store.file_content("o", receiving) == b"part"
    abandoned = store.begin_file("o", "batch", "in.jsonl", 2)
    store.append_chunk(abandoned, 0, b"lost")
    store.begin_file("o", "batch", "in.jsonl", 2 + ABANDONED_AFTER + 1)  # the next upload sweeps it
    with store.engine.connect() as conn:
        assert conn.execute(select(files.c.id).where(files.c.id == abandoned)).first() is None
        assert conn.execute(select(file_chunks.c.idx).where(file_chunks.c.file_id == abandoned)).first() is None
    assert store.file_content("o", receiving) == b"part"  # a finished one stays


def test_result_files_are_written_in_chunks(store: BatchStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "FILE_CHUNK", 100)
    batch_id = started(store, "o", jsonl(*(f"c{i}" for i in range(20))))
    claimed = store.claim_requests(batch_id, "w", 1000, LEASE, 100)
    for c in claimed:
        assert store.record(batch_id, c.line, ok_line(c.custom_id), ok=True)
    assert store.try_finalize(batch_id, 1001) == rules.COMPLETED
    batch = store.get_batch("o", batch_id)
    assert batch is not None
    output = store.file_content("o", batch["output_file_id"])
    assert output is not None
    assert [json.loads(line)["custom_id"] for line in output.splitlines()] == [f"c{i}" for i in range(20)]
    file = store.get_file("o", batch["output_file_id"])
    assert file is not None
    assert file["bytes"] == len(output)
    with store.engine.connect() as conn:
        sizes = list(
            conn.execute(
                select(func.length(file_chunks.c.data))
                .where(file_chunks.c.file_id == batch["output_file_id"])
                .order_by(file_chunks.c.idx)
            ).scalars()
        )
    assert len(sizes) == -(-len(output) // 100)
    assert all(size == 100 for size in sizes[:-1])


def test_files_stored_whole_by_the_previous_schema_are_moved_into_chunks(store: BatchStore) -> None:
    """A database of revision 0001 (each file one value) with files in it, upgraded: every byte readable."""
    store.migrate("0001")  # a fresh database at the old schema (the fixture's migrate is undone below)
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE batch_file_chunks"))
        conn.execute(text("DROP TABLE servlane_batch_alembic_version"))
        for table in ("batch_line_errors", "batch_requests", "batches", "batch_files"):
            conn.execute(text(f"DROP TABLE {table}"))
    store.migrate("0001")
    big = bytes(range(256)) * (FILE_CHUNK // 256) + b"more"  # a chunk and a bit
    old_files = sa_table(
        "batch_files", *(column(n) for n in ("id", "owner", "purpose", "filename", "bytes", "created_at", "content"))
    )
    with store.engine.begin() as conn:
        for file_id, content in (("file-big", big), ("file-small", b"{}"), ("file-empty", b"")):
            conn.execute(
                insert(old_files).values(
                    id=file_id,
                    owner="o",
                    purpose="batch",
                    filename="in.jsonl",
                    bytes=len(content),
                    created_at=1,
                    content=content,
                )
            )
    store.migrate()
    assert "content" not in {c["name"] for c in inspect(store.engine).get_columns("batch_files")}
    assert store.file_content("o", "file-big") == big
    assert store.file_content("o", "file-small") == b"{}"
    assert store.file_content("o", "file-empty") == b""
    assert [f["id"] for f in store.list_files("o", None, None, 10, True)[0]] == ["file-big", "file-empty", "file-small"]
    assert store.file_content("other", "file-big") is None


def test_a_file_deleted_while_it_is_read_is_not_taken_for_its_first_half(store: BatchStore) -> None:
    """A batch validated what it had read of an input file deleted meanwhile, as if it were the whole file."""
    content = b"x" * (FILE_CHUNK * 2 + 10)
    file = store.add_file("team-a", "batch", "in.jsonl", content, 1000)
    chunks = store.file_chunks("team-a", file["id"])
    assert next(chunks) == content[:FILE_CHUNK]
    assert store.delete_file("team-a", file["id"])
    with pytest.raises(FileGone):
        list(chunks)
    kept = store.add_file("team-a", "batch", "kept.jsonl", content, 1000)
    assert b"".join(store.file_chunks("team-a", kept["id"])) == content  # a whole file reads to its end


def test_a_value_the_database_refuses_is_a_400_not_a_503_to_retry(store: BatchStore) -> None:
    """PostgreSQL stores no NUL in text: ids, cursors and names holding one were "the database is down"."""

    async def lookup() -> object:
        return await in_db(store.get_file, "team-a", "file-\x00x")

    if store.engine.dialect.name == "postgresql":
        with pytest.raises(OpenAIError) as refused:
            asyncio.run(lookup())
        assert refused.value.status == 400
    else:
        assert asyncio.run(lookup()) is None  # SQLite takes the NUL: simply no such file


def test_a_database_error_quotes_no_parameter(store: BatchStore) -> None:
    """A statement's parameters are prompts and answers (tenants' data); an error's text, which the worker logs,
    quoted them."""
    with pytest.raises(DBAPIError) as failed, store.engine.begin() as conn:
        conn.execute(text("SELECT :prompt FROM no_such_table"), {"prompt": "a tenant's SECRET prompt"})
    assert "SECRET" not in str(failed.value)
