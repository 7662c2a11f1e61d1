"""Each batch's input size (batches.input_bytes), so that the copy of its lines an unfinished batch keeps counts
toward its owner's quota. Batches created before it count 0 until they end.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("input_bytes", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    raise NotImplementedError("the Batch API's schema is only migrated forward")
