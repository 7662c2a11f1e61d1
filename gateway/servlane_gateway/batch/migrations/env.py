"""Alembic's environment: always online, on the connection the store hands over (config.attributes)."""

from __future__ import annotations

from alembic import context

from servlane_gateway.batch.schema import metadata

VERSION_TABLE = "servlane_batch_alembic_version"  # its own: the database may be shared with other apps

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
