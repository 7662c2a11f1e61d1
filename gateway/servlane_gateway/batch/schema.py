"""The Batch API's tables, as the store queries them. The migrations (migrations/versions) create exactly
these; a change here needs a new migration."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    true,
)

metadata = MetaData()

files = Table(
    "batch_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),  # the API key's name; "" with access control off
    Column("purpose", String(32), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", Integer, nullable=False),
    # False while an upload is being received (its chunks arrive one by one): such a file is nobody's yet,
    # neither listed nor counted; one left behind by a process that died is swept after a while.
    Column("complete", Boolean, nullable=False, server_default=true()),
    Index("ix_batch_files_owner_created", "owner", "created_at"),
)

# A file's content, in chunks of at most store.FILE_CHUNK bytes, numbered from 0: written as it arrives
# (uploads) or is built (result files), read back one at a time, so no file is ever whole in memory.
file_chunks = Table(
    "batch_file_chunks",
    metadata,
    Column("file_id", String(64), ForeignKey("batch_files.id", ondelete="CASCADE"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("metadata_json", Text, nullable=True),
    Column("errors_json", Text, nullable=True),
    Column("created_at", Integer, nullable=False),
    Column("expires_at", Integer, nullable=False),
    Column("in_progress_at", Integer, nullable=True),
    Column("finalizing_at", Integer, nullable=True),
    Column("completed_at", Integer, nullable=True),
    Column("failed_at", Integer, nullable=True),
    Column("cancelling_at", Integer, nullable=True),
    Column("cancelled_at", Integer, nullable=True),
    Column("expired_at", Integer, nullable=True),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("total", Integer, nullable=False, default=0),
    # Its input file's size when it was created, and the size of the results recorded so far: the copy of its
    # lines and their answers, which the batch keeps until it ends (then they are its files), count toward its
    # owner's quota, whatever becomes of the input file.
    Column("input_bytes", BigInteger, nullable=False, server_default="0"),
    Column("output_bytes", BigInteger, nullable=False, server_default="0"),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    # Validation is claimed like requests: the replica holding the lease validates; another takes over after it.
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", Float, nullable=True),
    Index("ix_batches_owner_created", "owner", "created_at"),
    Index("ix_batches_status", "status"),
)

requests = Table(
    "batch_requests",
    metadata,
    Column("batch_id", String(64), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("custom_id", String(1024), nullable=False),
    Column("body", Text, nullable=False),
    Column("done", Boolean, nullable=False, default=False),
    Column("ok", Boolean, nullable=True),
    Column("result", Text, nullable=True),  # the output- or error-file line, written exactly once
    Column("attempts", Integer, nullable=False, default=0),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", Float, nullable=True),  # also "not before" for a request waiting to be retried
    # One result per custom_id per batch, whatever replica or restart sends it.
    UniqueConstraint("batch_id", "custom_id", name="uq_batch_requests_custom_id"),
    Index("ix_batch_requests_pending", "batch_id", "done", "lease_until"),
)

line_errors = Table(
    "batch_line_errors",
    metadata,
    Column("batch_id", String(64), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("result", Text, nullable=False),
)
