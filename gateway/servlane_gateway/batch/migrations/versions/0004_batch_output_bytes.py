"""Each batch's recorded results (batches.output_bytes), so that what an unfinished batch has answered counts
toward its owner's quota as it accrues, not only once it is written to files; and sizes as 64-bit integers
(PostgreSQL's INTEGER ends at 2 GiB, which a batch's output file or a quota's worth of results can pass;
SQLite's INTEGER is 64-bit already).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("output_bytes", sa.BigInteger, nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("batch_files", "bytes", type_=sa.BigInteger)
        op.alter_column("batches", "input_bytes", type_=sa.BigInteger)


def downgrade() -> None:
    raise NotImplementedError("the Batch API's schema is only migrated forward")
