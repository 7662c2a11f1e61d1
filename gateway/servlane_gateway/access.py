"""API keys: parsed from a mounted file, held only as SHA-256 hashes, checked in constant time.

File format (e.g. one Secret key mounted as a file), one entry per line:

    NAME: KEY [SCOPE,SCOPE...]

NAME labels the key (logs, rate limits) and is never secret. KEY is the bearer token, or `sha256:<hex>`
to store only its hash. The optional comma-separated list limits the key to those scopes; without it the
key may call everything. A scope names models the way a request does, so a key never reaches more than
its scope reads as: `namespace/name` is exactly that feature (or served model name) in that
namespace; a plain `name` is what a request for `name` gets, i.e. that name in the gateway's serving
namespaces only (never `other-namespace/name`); `namespace/*` is everything in that namespace.

A line whose first non-blank character is `#` is a comment; `#` anywhere else is part of the entry (a
key may contain `#`: cutting it there would silently make a shorter, weaker key), so comments after an
entry are an error, not ignored.

Fail closed: with no keys file, access control is off; with a keys file, it is on, and a file without
a single key refuses every request (an emptied Secret revokes everyone, it never opens the gateway).
A malformed line is reported by its line number only: its text may hold a key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from servlane_core.protocol.errors import OpenAIError, model_not_found
from servlane_core.routing.routes import Route, RouteTable

HASH_PREFIX = "sha256:"
ENTRY_FORMAT = "expected 'NAME: KEY [SCOPE,...]' (comments only on lines of their own)"
SCOPE_FORMAT = "a scope is 'name', 'namespace/name' or 'namespace/*'"
ANY_NAME = "*"
# A Kubernetes namespace name (DNS-1123 label): a typo such as `Prod/*` is refused, not a scope that never matches.
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Scope:
    """What one entry of a key's list lets it call; `namespace` None: a plain name (serving namespaces)."""

    namespace: str | None
    name: str  # ANY_NAME: everything in `namespace`

    def covers(self, route: Route, table: RouteTable) -> bool:
        if self.namespace is None:
            # Resolved exactly as a request for the plain name is, so `chat` never reaches `other-ns/chat`,
            # nor a namespace that a serving namespace earlier in the search path shadows.
            found = table.plain.get(self.name)
            return found is not None and (found.namespace, found.name) == (route.namespace, route.name)
        return self.namespace == route.namespace and self.name in (ANY_NAME, route.name)


def parse_scope(text: str) -> Scope:
    """`name`, `namespace/name` or `namespace/*`; ValueError (without the text: it sits next to a key)."""
    namespace, slash, name = text.rpartition("/")
    if not slash:
        if name == ANY_NAME:
            raise ValueError(SCOPE_FORMAT)  # everything: leave the list out instead
        return Scope(None, name)
    if not NAMESPACE.fullmatch(namespace) or not name:
        raise ValueError(SCOPE_FORMAT)
    return Scope(namespace, name)


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key; the key itself is never kept
    scopes: frozenset[Scope] | None  # None: everything

    def allows(self, route: Route, table: RouteTable) -> bool:
        """Whether this key may call `route` of `table` (the table that resolved the request)."""
        return self.scopes is None or any(scope.covers(route, table) for scope in self.scopes)


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
    scopes: frozenset[Scope] | None = None
    if len(parts) == 2:
        entries = [f for f in parts[1].split(",") if f]
        if not entries or any(f.startswith("#") for f in entries):
            raise ValueError(f"line {number}: {ENTRY_FORMAT}")
        try:
            scopes = frozenset(parse_scope(f) for f in entries)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return ApiKey(name, digest, scopes)


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


def authorize(key: ApiKey | None, route: Route, table: RouteTable, requested: str) -> None:
    """404 unless `key` (None: access control off) may call `route`, which `requested` resolved to in `table`.

    The very answer a missing model gets (as OpenAI does): a 403 would tell one team which names exist in
    another team's namespace."""
    if key is not None and not key.allows(route, table):
        raise model_not_found(requested)
