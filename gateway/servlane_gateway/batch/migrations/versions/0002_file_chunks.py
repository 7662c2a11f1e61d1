"""Files stored in chunks (batch_file_chunks) instead of one value each, and files being uploaded marked
incomplete. The content of existing files moves into chunks, one chunk at a time (never a whole file in
memory), then the old column goes.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
CHUNK = 1 << 20  # as store.FILE_CHUNK when this was written; chunks of another size read back the same


def upgrade() -> None:
    op.create_table(
        "batch_file_chunks",
        sa.Column("file_id", sa.String(64), sa.ForeignKey("batch_files.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.add_column("batch_files", sa.Column("complete", sa.Boolean, nullable=False, server_default=sa.true()))
    files = sa.table("batch_files", sa.column("id", sa.String), sa.column("content", sa.LargeBinary))
    chunks = sa.table(
        "batch_file_chunks", sa.column("file_id", sa.String), sa.column("idx", sa.Integer), sa.column("data")
    )
    bind = op.get_bind()
    sizes = bind.execute(sa.select(files.c.id, sa.func.length(files.c.content))).all()
    for file_id, size in sizes:
        for index, offset in enumerate(range(0, int(size or 0), CHUNK)):
            piece = bind.execute(
                sa.select(sa.func.substr(files.c.content, offset + 1, CHUNK)).where(files.c.id == file_id)
            ).scalar_one()
            bind.execute(sa.insert(chunks).values(file_id=file_id, idx=index, data=bytes(piece)))
    op.drop_column("batch_files", "content")  # SQLite 3.35+ drops it in place: no table copy, no cascade


def downgrade() -> None:
    raise NotImplementedError("the Batch API's schema is only migrated forward")
