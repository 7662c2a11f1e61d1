"""The Batch API's durable state in a SQL database (SQLAlchemy 2, synchronous: the async layer calls it in a
thread). PostgreSQL for replicas sharing work, SQLite for one process.

Exactly one result per request, whoever sends it: a request is claimed with a lease (owner + expiry) in one
UPDATE ... RETURNING, so no two live workers hold it; a worker that dies leaves its lease to expire and
another (or the restarted process) claims it again, so a request whose answer was never recorded is sent
again (at least once to the backend). Its result is written by an UPDATE that matches only a request not
yet done, so of two senders exactly one records it (and bumps the batch's counts in the same transaction),
and a batch's output file is built from those rows, one per custom_id (a unique constraint).

Every read and write names the owner: another API key's objects look exactly like missing ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from servlane_gateway.batch import rules
from servlane_gateway.batch.files import (
    FILE_CHUNK,
    FileGone,
    FileStore,
    QuotaExceeded,
    new_id,
    page,
    visible,
)
from servlane_gateway.batch.schema import batches, file_chunks, files, line_errors, requests

STREAM_ROWS = 1000  # result rows fetched at a time while a batch's files are written
BATCH_COLUMNS = ("output_file_id", "error_file_id", *rules.STAMPS.values())


@dataclass(frozen=True)
class Claimed:
    batch_id: str
    line: int
    custom_id: str
    body: dict[str, Any]
    attempts: int  # this try included


@dataclass(frozen=True)
class Active:
    """A batch the workers have something to do for."""

    id: str
    owner: str
    endpoint: str
    status: str
    expires_at: int


class BatchStore(FileStore):
    """The batches and their requests, claimed by the workers with leases (see the module's docstring)."""

    def create_batch(
        self, owner: str, input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None, now: int
    ) -> dict[str, Any]:
        """The new batch, validating; FileGone when the input file is not the owner's (any more). QuotaExceeded
        when the copy of its input it keeps until it ends would take the owner past `max_owner_bytes`: without
        that, one stored file made any number of batches, each a copy (a fill-up of the database all share)."""
        row: dict[str, Any] = {
            "id": new_id("batch_"),
            "owner": owner,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": window,
            "status": rules.VALIDATING,
            "metadata_json": json.dumps(metadata) if metadata is not None else None,
            "created_at": now,
            "expires_at": now + rules.COMPLETION_WINDOWS[window],
            "total": 0,
            "completed": 0,
            "failed": 0,
        }
        with self._tx() as conn:
            size = conn.execute(select(files.c.bytes).where(*visible(owner), files.c.id == input_file_id)).scalar()
            if size is None:
                raise FileGone(input_file_id)
            self._make_room(conn, owner, size)  # the batch's copy of its input, as an upload's bytes
            conn.execute(insert(batches).values({**row, "input_bytes": size}))
            created = conn.execute(select(batches).where(batches.c.id == row["id"])).one()
        return batch_object(created._mapping)

    def _used(self, conn: Connection, owner: str) -> int:
        """The owner's stored files, and what its unfinished batches keep: the copy of their inputs and the
        results recorded so far."""
        copies = select(func.coalesce(func.sum(batches.c.input_bytes + batches.c.output_bytes), 0)).where(
            batches.c.owner == owner, batches.c.status.not_in(rules.FINAL)
        )
        return super()._used(conn, owner) + int(conn.execute(copies).scalar() or 0)

    def get_batch(self, owner: str, batch_id: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            row = conn.execute(select(batches).where(batches.c.id == batch_id, batches.c.owner == owner)).first()
        return batch_object(row._mapping) if row else None

    def list_batches(self, owner: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        with self._tx() as conn:
            rows = page(conn, select(batches).where(batches.c.owner == owner), batches, owner, after, limit, False)
        return [batch_object(r._mapping) for r in rows[:limit]], len(rows) > limit

    def latest_batches(self, owner: str | None, limit: int) -> list[dict[str, Any]]:
        """The newest batches, of one owner (None: of everyone), for the console."""
        query = select(batches).order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit)
        if owner is not None:
            query = query.where(batches.c.owner == owner)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [batch_object(r._mapping) | {"owner": r._mapping["owner"]} for r in rows]

    def cancel_batch(self, owner: str, batch_id: str, now: int) -> dict[str, Any] | None:
        """The batch, now cancelling (TransitionError when it is past that); None when it is not the owner's."""
        with self._tx() as conn:
            row = conn.execute(
                select(batches.c.status).where(batches.c.id == batch_id, batches.c.owner == owner).with_for_update()
            ).first()
            if row is None:
                return None
            if row.status not in (rules.CANCELLING, rules.CANCELLED):
                rules.move(row.status, rules.CANCELLING)
                conn.execute(
                    update(batches).where(batches.c.id == batch_id).values(status=rules.CANCELLING, cancelling_at=now)
                )
            found = conn.execute(select(batches).where(batches.c.id == batch_id)).one()
        return batch_object(found._mapping)

    # -- the workers' side --------------------------------------------------------------------------

    def claim_validation(self, me: str, now: float, lease: float) -> dict[str, Any] | None:
        """A batch to validate that no live worker holds (its input file is read with file_chunks)."""
        with self._tx() as conn:
            # Two statements, not UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED): PostgreSQL may
            # run such a subquery again per row, each time skipping the rows this very UPDATE locked.
            candidate = conn.execute(
                select(batches.c.id)
                .where(batches.c.status == rules.VALIDATING, _lease_free(batches, now))
                .limit(1)
                .with_for_update(skip_locked=True)
            ).scalar()
            if candidate is None:
                return None
            claimed = conn.execute(
                update(batches)
                .where(batches.c.id == candidate, batches.c.status == rules.VALIDATING, _lease_free(batches, now))
                .values(lease_owner=me, lease_until=now + lease)
                .returning(batches.c.id, batches.c.owner, batches.c.endpoint, batches.c.input_file_id)
            ).first()
        return dict(claimed._mapping) if claimed is not None else None

    def finish_validation(self, batch_id: str, me: str, validated: rules.Validated, now: int) -> str | None:
        """Writes the validated lines and moves the batch on (in_progress, or failed), in one transaction: a
        worker that dies halfway leaves nothing behind. None when this worker no longer holds the batch."""
        with self._tx() as conn:
            held = conn.execute(
                select(batches.c.status).where(batches.c.id == batch_id, batches.c.lease_owner == me).with_for_update()
            ).first()
            if held is None or held.status != rules.VALIDATING:
                return None
            if validated.fatal is not None:
                values: dict[str, Any] = {
                    "status": rules.FAILED,
                    "failed_at": now,
                    "errors_json": json.dumps(rules.batch_errors(validated.fatal, validated.errors)),
                }
            else:
                if validated.requests:
                    conn.execute(
                        insert(requests),
                        [
                            {
                                "batch_id": batch_id,
                                "line": r.line,
                                "custom_id": r.custom_id,
                                "body": json.dumps(r.body),
                                "done": False,
                                "attempts": 0,
                            }
                            for r in validated.requests
                        ],
                    )
                if validated.errors:
                    conn.execute(
                        insert(line_errors),
                        [
                            {
                                "batch_id": batch_id,
                                "line": e.line,
                                "result": rules.json_line(rules.error_line(e, new_id("batch_req_"))),
                            }
                            for e in validated.errors
                        ],
                    )
                values = {
                    "status": rules.IN_PROGRESS,
                    "in_progress_at": now,
                    "total": validated.total,
                    "failed": len(validated.errors),
                }
            conn.execute(
                update(batches).where(batches.c.id == batch_id).values(lease_owner=None, lease_until=None, **values)
            )
        return str(values["status"])

    def active_batches(self) -> list[Active]:
        """The batches with requests to send or results to write (validation aside)."""
        query = select(batches.c.id, batches.c.owner, batches.c.endpoint, batches.c.status, batches.c.expires_at)
        query = query.where(batches.c.status.in_((rules.IN_PROGRESS, rules.CANCELLING, rules.FINALIZING)))
        with self._tx() as conn:
            return [Active(**r._mapping) for r in conn.execute(query.order_by(batches.c.created_at))]

    def claim_requests(self, batch_id: str, me: str, now: float, lease: float, limit: int) -> list[Claimed]:
        """Up to `limit` requests of an in-progress batch that are not done and whose lease (if any) ran out."""
        pending = and_(requests.c.batch_id == batch_id, requests.c.done.is_(False), _lease_free(requests, now))
        with self._tx() as conn:
            status = conn.execute(select(batches.c.status).where(batches.c.id == batch_id)).scalar()
            if status != rules.IN_PROGRESS:
                return []
            # Locked first, then leased (see claim_validation); the UPDATE checks again that each is free.
            lines = (
                conn.execute(
                    select(requests.c.line)
                    .where(pending)
                    .order_by(requests.c.line)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
                .scalars()
                .all()
            )
            if not lines:
                return []
            rows = conn.execute(
                update(requests)
                .where(pending, requests.c.line.in_(lines))
                .values(lease_owner=me, lease_until=now + lease, attempts=requests.c.attempts + 1)
                .returning(requests.c.line, requests.c.custom_id, requests.c.body, requests.c.attempts)
            ).all()
        claimed = [Claimed(batch_id, r.line, r.custom_id, json.loads(r.body), r.attempts) for r in rows]
        return sorted(claimed, key=lambda c: c.line)

    def renew(self, me: str, lines: list[tuple[str, int]], now: float, lease: float) -> None:
        """Extends this worker's leases on the requests it is still sending."""
        if not lines:
            return
        with self._tx() as conn:
            for batch_id, line in lines:
                conn.execute(update(requests).where(*_held_by(me, batch_id, line)).values(lease_until=now + lease))

    def record(self, batch_id: str, line: int, result: dict[str, Any], ok: bool, now: float | None = None) -> bool:
        """Writes a request's result unless one was written already or the batch has ended (a late answer to
        a finished batch changes nothing); True when this call wrote it. A result that would take the batch's
        owner past `max_owner_bytes` is not kept: the line gets a `storage_quota_exceeded` error instead and
        the batch is cancelled, so no more of its requests are sent (their answers would have nowhere to go)."""
        stored = rules.json_line(result)
        with self._tx() as conn:
            # The batch row first (as try_finalize locks it): its counts change with the request's row.
            batch = conn.execute(
                select(batches.c.status, batches.c.owner).where(batches.c.id == batch_id).with_for_update()
            ).first()
            if batch is None or batch.status not in (rules.IN_PROGRESS, rules.CANCELLING):
                return False
            size = len(stored.encode()) + 1  # its line in the output or error file
            over: str | None = None  # why the answer is not kept
            try:
                self._make_room(conn, batch.owner, size)
            except QuotaExceeded as exc:
                over, ok = rules.quota_message(exc.used, exc.size, exc.quota), False
                stored = rules.json_line(rules.quota_line(str(result.get("id")), str(result.get("custom_id")), over))
                size = len(stored.encode()) + 1  # kept past the quota: a short line saying why
            written = conn.execute(
                update(requests)
                .where(requests.c.batch_id == batch_id, requests.c.line == line, requests.c.done.is_(False))
                .values(done=True, ok=ok, result=stored, lease_owner=None, lease_until=None)
            ).rowcount
            if written != 1:
                return False
            counter = batches.c.completed if ok else batches.c.failed
            values: dict[Any, Any] = {counter: counter + 1, batches.c.output_bytes: batches.c.output_bytes + size}
            if over is not None and batch.status == rules.IN_PROGRESS:
                rules.move(batch.status, rules.CANCELLING)
                values |= {
                    batches.c.status: rules.CANCELLING,
                    batches.c.cancelling_at: int(now if now is not None else time.time()),
                    batches.c.errors_json: json.dumps(rules.quota_errors(over)),
                }
            conn.execute(update(batches).where(batches.c.id == batch_id).values(values))
        return True

    def retry_later(self, batch_id: str, line: int, me: str, not_before: float) -> None:
        """Gives a request back to the queue, not to be claimed before `not_before`."""
        with self._tx() as conn:
            conn.execute(
                update(requests).where(*_held_by(me, batch_id, line)).values(lease_owner=None, lease_until=not_before)
            )

    def try_finalize(self, batch_id: str, now: float) -> str | None:
        """Writes the output and error files and ends the batch when it is done: every request answered
        (completed), its window passed (expired: the unanswered go to the error file), or it is cancelling and
        no live worker is sending any of its requests (cancelled). None while it is not done. One transaction:
        of several workers trying at once exactly one finalizes (the row lock and the status check)."""
        with self._tx() as conn:
            batch = conn.execute(select(batches).where(batches.c.id == batch_id).with_for_update()).first()
            if batch is None or batch.status not in (rules.IN_PROGRESS, rules.CANCELLING, rules.FINALIZING):
                return None
            expired = now >= batch.expires_at and batch.status != rules.CANCELLING
            undone = and_(requests.c.batch_id == batch_id, requests.c.done.is_(False))
            if batch.status == rules.CANCELLING:
                busy = and_(undone, requests.c.lease_owner.is_not(None), requests.c.lease_until > now)
                if conn.execute(select(func.count()).where(busy)).scalar():
                    return None
            elif not expired and conn.execute(select(func.count()).where(undone)).scalar():
                return None
            final = rules.final_status_of_finalizing(batch.status, expired)
            # The files are written from the stored result lines as they are read (streamed from the
            # database), a chunk at a time: memory is one chunk per file, whatever the batch's size.
            stamp = int(now)
            output, errors = (
                ChunkWriter(conn, batch.owner, f"{batch_id}_{kind}.jsonl", stamp) for kind in ("output", "error")
            )
            answered = select(requests.c.ok, requests.c.result).where(
                requests.c.batch_id == batch_id, requests.c.done.is_(True)
            )
            for r in conn.execute(answered.order_by(requests.c.line).execution_options(yield_per=STREAM_ROWS)):
                (output if r.ok else errors).write(r.result.encode() + b"\n")
            invalid = select(line_errors.c.result).where(line_errors.c.batch_id == batch_id)
            for r in conn.execute(invalid.order_by(line_errors.c.line).execution_options(yield_per=STREAM_ROWS)):
                errors.write(r.result.encode() + b"\n")
            failed_more = 0
            if final == rules.EXPIRED:
                left = conn.execute(
                    select(requests.c.line, requests.c.custom_id).where(undone).order_by(requests.c.line)
                ).all()
                for r in left:  # recorded as answered, so nothing is sent or written for them any more
                    expired_result = rules.json_line(rules.expired_line(new_id("batch_req_"), r.custom_id))
                    errors.write(expired_result.encode() + b"\n")
                    conn.execute(
                        update(requests)
                        .where(requests.c.batch_id == batch_id, requests.c.line == r.line)
                        .values(done=True, ok=False, result=expired_result, lease_owner=None, lease_until=None)
                    )
                failed_more = len(left)
            values: dict[str, Any] = {"status": final, rules.STAMPS[final]: stamp, "finalizing_at": stamp}
            values["failed"] = batches.c.failed + failed_more
            for key, writer in (("output_file_id", output), ("error_file_id", errors)):
                if (file_id := writer.close()) is not None:
                    values[key] = file_id
            conn.execute(update(batches).where(batches.c.id == batch_id).values(values))
            # Its lines and results are in its files now (which count toward the quota): the copies go.
            conn.execute(delete(requests).where(requests.c.batch_id == batch_id))
            conn.execute(delete(line_errors).where(line_errors.c.batch_id == batch_id))
        return final


class ChunkWriter:
    """A result file written chunk by chunk inside the finalizing transaction; no file when nothing came."""

    def __init__(self, conn: Connection, owner: str, filename: str, now: int) -> None:
        self.conn, self.owner, self.filename, self.now = conn, owner, filename, now
        self.file_id: str | None = None
        self.pending = bytearray()
        self.chunks = self.size = 0

    def write(self, data: bytes) -> None:
        self.pending += data
        self.size += len(data)
        while len(self.pending) >= FILE_CHUNK:
            self._flush(FILE_CHUNK)

    def _flush(self, size: int) -> None:
        if self.file_id is None:
            self.file_id = new_id("file-")
            row = {"owner": self.owner, "purpose": rules.OUTPUT_PURPOSE, "filename": self.filename, "bytes": 0}
            self.conn.execute(insert(files).values({**row, "id": self.file_id, "created_at": self.now}))
        data = bytes(self.pending[:size])
        del self.pending[:size]
        self.conn.execute(insert(file_chunks).values(file_id=self.file_id, idx=self.chunks, data=data))
        self.chunks += 1

    def close(self) -> str | None:
        """The file's id, its size written; None when nothing was written."""
        if self.pending:
            self._flush(len(self.pending))
        if self.file_id is not None:
            self.conn.execute(update(files).where(files.c.id == self.file_id).values(bytes=self.size))
        return self.file_id


def _held_by(me: str, batch_id: str, line: int) -> tuple[Any, ...]:
    """The request `line` of `batch_id` while worker `me` holds its lease and it has no result yet."""
    return (
        requests.c.batch_id == batch_id,
        requests.c.line == line,
        requests.c.lease_owner == me,
        requests.c.done.is_(False),
    )


def _lease_free(table: Any, now: float) -> Any:
    return or_(table.c.lease_until.is_(None), table.c.lease_until <= now)


def batch_object(row: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": json.loads(row["errors_json"]) if row["errors_json"] else None,
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
        "metadata": json.loads(row["metadata_json"]) if row["metadata_json"] else None,
    }
    obj |= {name: row[name] for name in BATCH_COLUMNS}
    return obj
