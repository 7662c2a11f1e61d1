"""API keys: parsed from a mounted file, held only as SHA-256 hashes, checked in constant time.

File format (e.g. one Secret key mounted as a file), one entry per line:

    NAME: KEY [FEATURE,FEATURE...]

NAME labels the key (logs, rate limits) and is never secret. KEY is the bearer token, or `sha256:<hex>`
to store only its hash. The optional comma-separated list limits the key to those features (or served
model names); without it the key may call everything. A line whose first non-blank character is `#` is a
comment; `#` anywhere else is part of the entry (a key may contain `#`: cutting it there would silently
make a shorter, weaker key), so comments after an entry are an error, not ignored.

Fail closed: with no keys file, access control is off; with a keys file, it is on, and a file without
a single key refuses every request (an emptied Secret revokes everyone, it never opens the gateway).
A malformed line is reported by its line number only: its text may hold a key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from servlane_core.protocol.errors import OpenAIError

HASH_PREFIX = "sha256:"
ENTRY_FORMAT = "expected 'NAME: KEY [FEATURE,...]' (comments only on lines of their own)"


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key; the key itself is never kept
    features: frozenset[str] | None  # None: every feature

    def allows(self, feature: str) -> bool:
        return self.features is None or feature in self.features


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_key_line(line: str, number: int = 1) -> ApiKey | None:
    """One entry, or None for a blank or comment line; ValueError naming only the line number when malformed."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    name, sep, rest = text.partition(":")
    name = name.strip()
    parts = rest.split()
    if not sep or not name or not parts or len(parts) > 2:
        raise ValueError(f"line {number}: {ENTRY_FORMAT}")
    secret = parts[0]
    if secret.startswith(HASH_PREFIX):
        try:
            digest = bytes.fromhex(secret[len(HASH_PREFIX) :])
        except ValueError:
            digest = b""
        if len(digest) != hashlib.sha256().digest_size:
            raise ValueError(f"line {number}: a sha256: key needs exactly 64 hex digits")
    else:
        digest = hash_key(secret)
    features: frozenset[str] | None = None
    if len(parts) == 2:
        features = frozenset(f for f in parts[1].split(",") if f)
        if not features or any(f.startswith("#") for f in features):
            raise ValueError(f"line {number}: {ENTRY_FORMAT}")
    return ApiKey(name, digest, features)


def parse_keys(text: str) -> list[ApiKey]:
    keys: list[ApiKey] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        key = parse_key_line(line, number)
        if key is None:
            continue
        if key.name in first_line:
            raise ValueError(f"line {number}: the key name of line {first_line[key.name]} again (names must be unique)")
        first_line[key.name] = number
        keys.append(key)
    return keys


def no_keys_refusal() -> OpenAIError:
    return OpenAIError(
        403,
        "This gateway has a keys file without any key, so it refuses every request.",
        type="permission_error",
        code="no_api_keys_configured",
    )


class KeyRing:
    """The configured keys, or None when no keys file is configured (access control off). A keys file
    turns access control on whatever it holds: an empty list of keys refuses everyone."""

    def __init__(self, keys: list[ApiKey] | None = None) -> None:
        self.enabled = keys is not None
        self.keys = list(keys or [])

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
        if not self.keys:
            raise no_keys_refusal()
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
