"""API keys: parsed from a mounted file, held only as SHA-256 hashes, checked in constant time.

File format (e.g. one Secret key mounted as a file), one entry per line, `#` starts a comment:

    NAME: KEY [FEATURE,FEATURE...]

NAME labels the key (logs, rate limits) and is never secret. KEY is the bearer token, or `sha256:<hex>`
to store only its hash. The optional comma-separated list limits the key to those features (or served
model names); without it the key may call everything. With no keys configured, access control is off.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from servlane_core.protocol.errors import OpenAIError

HASH_PREFIX = "sha256:"


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key; the key itself is never kept
    features: frozenset[str] | None  # None: every feature

    def allows(self, feature: str) -> bool:
        return self.features is None or feature in self.features


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_key_line(line: str) -> ApiKey | None:
    """One entry, or None for a blank or comment line; ValueError (without the key) when malformed."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    name, sep, rest = text.partition(":")
    parts = rest.split()
    if not sep or not name.strip() or not parts or len(parts) > 2:
        raise ValueError(f"expected 'NAME: KEY [FEATURE,...]' in the entry named {name.strip()!r}")
    secret = parts[0]
    if secret.startswith(HASH_PREFIX):
        digest = bytes.fromhex(secret[len(HASH_PREFIX) :])
        if len(digest) != hashlib.sha256().digest_size:
            raise ValueError(f"key {name.strip()!r}: a sha256: entry needs 64 hex digits")
    else:
        digest = hash_key(secret)
    features = frozenset(f for f in parts[1].split(",") if f) if len(parts) == 2 else None
    return ApiKey(name.strip(), digest, features)


def parse_keys(text: str) -> list[ApiKey]:
    keys = [k for k in (parse_key_line(line) for line in text.splitlines()) if k is not None]
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise ValueError("key names must be unique")
    return keys


class KeyRing:
    """The configured keys; `enabled` is False when there are none (access control off)."""

    def __init__(self, keys: list[ApiKey] | None = None) -> None:
        self.keys = list(keys or [])

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def find(self, presented: str) -> ApiKey | None:
        """The key whose hash matches; every stored hash is compared so timing tells nothing."""
        digest = hash_key(presented)
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The caller's key from `Authorization: Bearer ...`; None when access control is off."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise OpenAIError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")
        key = self.find(token.strip())
        if key is None:
            raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return key


def authorize(key: ApiKey | None, feature: str) -> None:
    if key is not None and not key.allows(feature):
        raise OpenAIError(
            403,
            f"This API key may not use the model '{feature}'.",
            type="permission_error",
            param="model",
            code="model_not_allowed",
        )
