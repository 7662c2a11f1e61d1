"""Credentials out of text bound for logs, status, events and error messages: one set of rules for every part.

A presigned URL's query string (X-Amz-Signature, X-Amz-Credential: a download the Hugging Face Hub redirects
to, an S3 object), a URL's userinfo (user:password@), a Hugging Face token, a bearer token, and any value the
caller knows is secret (a credential's environment variable). An error from an HTTP library quotes the URL it
failed on, and a reason a runtime dies with reaches the pod's termination message, the AIModel's conditions and
events, /ready and the log: anyone who can read pods or AIModels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "***"
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
# A URL's or a path's query string: cut whole (its parameters' names say nothing a reader needs).
_QUERY = re.compile(r"(https?://[^\s?]*|/[^\s?]*)\?[^\s]*")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{16,}")
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")


def without_query_strings(text: str) -> str:
    """`text` with every URL's or path's query string cut off."""
    return _QUERY.sub(r"\1", text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secret values, URL passwords and query strings, Hugging Face or bearer tokens."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    text = _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    text = without_query_strings(text)
    text = _HF_TOKEN.sub(f"hf_{REDACTED}", text)
    return _BEARER.sub(rf"\1 {REDACTED}", text)
