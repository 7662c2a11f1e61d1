"""Alembic migrations of the Batch API's tables, shipped in the package and run at the gateway's start."""
