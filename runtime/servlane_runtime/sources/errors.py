"""The one error a model source raises: its message names the source and, for a store, quotes the store."""

from __future__ import annotations

# A URL's query string (a presigned URL's X-Amz-Signature and credential) never reaches a message: the shared
# redaction's rule, re-exported for the sources.
from servlane_core.redaction import without_query_strings

__all__ = ["ModelSourceError", "without_query_strings"]


class ModelSourceError(Exception):
    """The model files cannot be had; the message is shown in /ready, the logs and the termination message."""
