"""The batch store's database and its files: uploads and results kept in chunks, never whole in memory.

Every read and write names the owner: another API key's objects look exactly like missing ones.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    and_,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url

from servlane_gateway.batch.schema import file_chunks, files

MIGRATIONS = Path(__file__).parent / "migrations"
PG_MIGRATION_LOCK = 7_163_201_118  # pg_advisory_lock id: replicas starting together migrate one at a time
FILE_CHUNK = 1 << 20  # the bytes of a stored chunk of a file (batch_file_chunks): its content is never whole
ABANDONED_AFTER = 6 * 3600  # seconds after which an incomplete upload is its dead process's, and is swept
FILE_COLUMNS = tuple(c for c in files.c if c.name != "complete")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def engine_url(url: str) -> str:
    """postgresql:// and postgres:// mean psycopg 3 (the driver installed); anything else as given."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


SECRET_PARAMETER_WORDS = ("password", "secret", "token", "key")  # sslpassword, sslkey, auth_token, ...


def redacted(url: str) -> str:
    """The URL for logs, errors and status: without its password, nor any query parameter that may hold a
    secret (libpq takes `password` and `sslpassword` there too; render_as_string hides only the userinfo)."""
    try:
        parsed = make_url(engine_url(url))
        hidden = {name: "***" for name in parsed.query if any(word in name.lower() for word in SECRET_PARAMETER_WORDS)}
        return parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


class FileGone(Exception):
    """A file deleted while it was being read: what was read of it is not the whole file."""


class QuotaExceeded(Exception):
    """An upload that would take its owner's stored files past their quota."""

    def __init__(self, used: int, size: int, quota: int) -> None:
        super().__init__(f"{used} + {size} bytes is past the quota of {quota}")
        self.used, self.size, self.quota = used, size, quota


def _sqlite_engine(url: str) -> Engine:
    # hide_parameters: a database error's text quotes its statement's parameters (prompts, answers: tenants'
    # data), and the worker logs the errors it cannot handle.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, hide_parameters=True)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # transactions are begun below, as BEGIN IMMEDIATE
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # Take the write lock up front: a read-then-write transaction cannot then fail halfway with "locked".
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class FileStore:
    """The database (engine, migrations, transactions) and the uploaded and result files kept in it."""

    def __init__(self, url: str, max_owner_bytes: int | None = None) -> None:
        self.url = engine_url(url)
        self.max_owner_bytes = max_owner_bytes  # the most bytes of uploads and results one owner keeps
        self.dialect = make_url(self.url).get_backend_name()
        if self.dialect == "sqlite":
            self.engine = _sqlite_engine(self.url)
        else:
            self.engine = create_engine(
                self.url,
                pool_pre_ping=True,
                pool_size=10,
                max_overflow=10,
                connect_args={"connect_timeout": 5},
                hide_parameters=True,  # see _sqlite_engine
            )

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def migrate(self, revision: str = "head") -> None:
        """Brings the schema to the newest migration (or `revision`: tests of an upgrade); replicas starting
        together take turns (PostgreSQL)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.connect() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": PG_MIGRATION_LOCK})
                conn.commit()
            try:
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
                conn.commit()
            finally:
                if self.dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": PG_MIGRATION_LOCK})
                    conn.commit()

    # -- files --------------------------------------------------------------------------------------

    def begin_file(self, owner: str, purpose: str, filename: str, now: int) -> str:
        """A new, incomplete file for an upload whose chunks follow (append_chunk, then finish_file or
        discard_file); first sweeps the incomplete files of uploads that ended long ago without either."""
        file_id = new_id("file-")
        row = {"id": file_id, "owner": owner, "purpose": purpose, "filename": filename, "bytes": 0}
        with self._tx() as conn:
            conn.execute(delete(files).where(files.c.complete.is_(False), files.c.created_at < now - ABANDONED_AFTER))
            conn.execute(insert(files).values({**row, "created_at": now, "complete": False}))
        return file_id

    def append_chunk(self, file_id: str, index: int, data: bytes | bytearray) -> None:
        """Chunk `index` (0, 1, ...) of a file: a short transaction of its own, so an upload as slow as its
        sender holds no lock between its chunks."""
        with self._tx() as conn:
            conn.execute(insert(file_chunks).values(file_id=file_id, idx=index, data=bytes(data)))

    def finish_file(self, owner: str, file_id: str, size: int) -> dict[str, Any]:
        """Makes an upload of `size` bytes visible; QuotaExceeded when it would take the owner past
        `max_owner_bytes` (result files count too, but are always written: the owner deletes files to upload
        more). The caller discards the file then."""
        with self._tx() as conn:
            self._make_room(conn, owner, size)
            done = conn.execute(
                update(files)
                .where(files.c.id == file_id, files.c.owner == owner, files.c.complete.is_(False))
                .values(bytes=size, complete=True)
                .returning(*FILE_COLUMNS)
            ).first()
        if done is None:
            raise LookupError(f"the upload {file_id} was swept before it finished")
        return file_object(done._mapping)

    def discard_file(self, file_id: str) -> None:
        """Drops an upload that did not finish (and its chunks)."""
        with self._tx() as conn:
            conn.execute(delete(files).where(files.c.id == file_id, files.c.complete.is_(False)))

    def add_file(self, owner: str, purpose: str, filename: str, content: bytes | bytearray, now: int) -> dict[str, Any]:
        """Stores a file given whole (small files, tests): chunk by chunk, as an upload does."""
        file_id = self.begin_file(owner, purpose, filename, now)
        try:
            for index, offset in enumerate(range(0, len(content), FILE_CHUNK)):
                self.append_chunk(file_id, index, content[offset : offset + FILE_CHUNK])
            return self.finish_file(owner, file_id, len(content))
        except BaseException:
            self.discard_file(file_id)
            raise

    def _used(self, conn: Connection, owner: str) -> int:
        used = conn.execute(select(func.coalesce(func.sum(files.c.bytes), 0)).where(files.c.owner == owner))
        return int(used.scalar() or 0)

    def _make_room(self, conn: Connection, owner: str, size: int) -> None:
        """QuotaExceeded when `size` more bytes would take the owner past `max_owner_bytes`; else the owner
        stays locked until the transaction ends, so two writes at once cannot both pass the check."""
        if self.max_owner_bytes is None:
            return
        self._lock_owner(conn, owner)
        in_use = self._used(conn, owner)
        if in_use + size > self.max_owner_bytes:
            raise QuotaExceeded(in_use, size, self.max_owner_bytes)

    def _lock_owner(self, conn: Connection, owner: str) -> None:
        """Serialises the owner's uploads until the transaction ends (SQLite: BEGIN IMMEDIATE already does)."""
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": "batch-files:" + owner})

    def file_chunk(self, owner: str, file_id: str, index: int) -> bytes | None:
        """Chunk `index` of a complete file of the owner's; None past its last chunk, or when it is not the
        owner's (any more)."""
        query = (
            select(file_chunks.c.data)
            .join(files, files.c.id == file_chunks.c.file_id)
            .where(*visible(owner), files.c.id == file_id, file_chunks.c.idx == index)
        )
        with self._tx() as conn:
            data = conn.execute(query).scalar()
        return bytes(data) if data is not None else None

    def file_chunks(self, owner: str, file_id: str) -> Iterator[bytes]:
        """A file's content, one chunk (one short query) at a time: nothing is held between them. FileGone when
        the file was deleted after its first chunk was read: a missing chunk was its end only if the file is
        still there (a batch validated the half it had read, as if it were the whole). A file not there (or not
        the owner's) from the start reads as empty: its callers look it up first."""
        index = 0
        while (data := self.file_chunk(owner, file_id, index)) is not None:
            yield data
            index += 1
        if index and self.get_file(owner, file_id) is None:
            raise FileGone(file_id)

    def get_file(self, owner: str, file_id: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            row = conn.execute(select(*FILE_COLUMNS).where(*visible(owner), files.c.id == file_id)).first()
        return file_object(row._mapping) if row else None

    def file_content(self, owner: str, file_id: str) -> bytes | None:
        """A whole file (tests, small files); the gateway itself reads files with file_chunks."""
        if self.get_file(owner, file_id) is None:
            return None
        return b"".join(self.file_chunks(owner, file_id))

    def delete_file(self, owner: str, file_id: str) -> bool:
        with self._tx() as conn:
            return conn.execute(delete(files).where(*visible(owner), files.c.id == file_id)).rowcount == 1

    def list_files(
        self, owner: str, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        query = select(*FILE_COLUMNS).where(*visible(owner))
        if purpose:
            query = query.where(files.c.purpose == purpose)
        with self._tx() as conn:
            rows = page(conn, query, files, owner, after, limit, ascending)
        return [file_object(r._mapping) for r in rows[:limit]], len(rows) > limit

    # -- batches ------------------------------------------------------------------------------------


def visible(owner: str) -> tuple[Any, ...]:
    """The owner's files whose upload finished."""
    return (files.c.owner == owner, files.c.complete.is_(True))


def page(
    conn: Connection, query: Any, table: Any, owner: str, after: str | None, limit: int, ascending: bool
) -> list[Row[Any]]:
    """Newest first (or oldest first), `limit` + 1 rows (the extra one says whether more follow), starting
    after the object `after` (ignored when it is not the owner's)."""
    if after:
        cursor = conn.execute(select(table.c.created_at).where(table.c.id == after, table.c.owner == owner)).first()
        if cursor is not None:
            at = cursor.created_at
            if ascending:
                query = query.where(or_(table.c.created_at > at, and_(table.c.created_at == at, table.c.id > after)))
            else:
                query = query.where(or_(table.c.created_at < at, and_(table.c.created_at == at, table.c.id < after)))
    order = (table.c.created_at, table.c.id) if ascending else (table.c.created_at.desc(), table.c.id.desc())
    return list(conn.execute(query.order_by(*order).limit(limit + 1)).all())


def file_object(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }
