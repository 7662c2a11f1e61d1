"""The one error a model source raises: its message names the source and, for a store, quotes the store."""

from __future__ import annotations

import re


class ModelSourceError(Exception):
    """The model files cannot be had; the message is shown in /ready, the logs and the termination message."""


# A URL's query string (a presigned URL's X-Amz-Signature and credential) never reaches a message.
_QUERY = re.compile(r"(https?://[^\s?]*|/[^\s?]*)\?[^\s]*")


def without_query_strings(text: str) -> str:
    """`text` with every URL's or path's query string cut off."""
    return _QUERY.sub(r"\1", text)
