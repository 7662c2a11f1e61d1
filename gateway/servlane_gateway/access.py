"""API keys: parsed from a mounted file, held only as SHA-256 hashes, looked up by the hash of the key presented.

File format (e.g. one Secret key mounted as a file), one entry per line:

    NAME: KEY [SCOPE,SCOPE...]

NAME labels the key (logs, rate limits) and is never secret. KEY is the bearer token (at least
MIN_KEY_LENGTH characters), or `sha256:<hex>` to store only its hash. The optional comma-separated list
limits the key to those scopes; without it the key may call everything (an admin key). A scope always
names its namespace: `namespace/name` is exactly that feature (or served model name) in that namespace,
`namespace/*` everything in that namespace. A plain `name` is refused: it used to follow whatever the
name resolved to, so another team's new object of that name could take the key's traffic.

The namespaces a key's scopes name, in the order first listed, are the key's own: a plain model name in
its requests resolves there (servlane_core.routing.name_resolution).

A line whose first non-blank character is `#` is a comment; `#` anywhere else is part of the entry (a
key may contain `#`: cutting it there would silently make a shorter, weaker key), so comments after an
entry are an error, not ignored.

Fail closed: with no keys file, access control is off; with a keys file, it is on, and a file without
a single key refuses every request (an emptied Secret revokes everyone, it never opens the gateway); a
file that does not parse refuses every request too (KeyRing.broken), so a revocation with a typo never
leaves the revoked key valid. A malformed line is reported by its line number only: its text may hold a key.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

from servlane_core.protocol.errors import OpenAIError, model_not_found
from servlane_core.routing.name_resolution import resolve_name, visible_names
from servlane_core.routing.routes import Route, RouteTable

HASH_PREFIX = "sha256:"
# A plaintext key shorter than this is refused: guessable, and a paste error (a truncated key) looks like one.
MIN_KEY_LENGTH = 32
ENTRY_FORMAT = "expected 'NAME: KEY [SCOPE,...]' (comments only on lines of their own)"
SCOPE_FORMAT = "a scope is 'namespace/name' or 'namespace/*'"
PLAIN_SCOPE = (
    "a scope needs its namespace: write 'namespace/name' (or 'namespace/*'); a plain name would follow "
    "whichever namespace the name resolves to"
)
ANY_NAME = "*"
# A Kubernetes namespace name (DNS-1123 label): a typo such as `Prod/*` is refused, not a scope that never matches.
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Scope:
    """What one entry of a key's list lets it call: `name` in `namespace` (ANY_NAME: all of it)."""

    namespace: str
    name: str

    def covers(self, route: Route) -> bool:
        return self.namespace == route.namespace and self.name in (ANY_NAME, route.name)


def parse_scope(text: str) -> Scope:
    """`namespace/name` or `namespace/*`; ValueError (without the text: it sits next to a key)."""
    namespace, slash, name = text.rpartition("/")
    if not slash:
        raise ValueError(SCOPE_FORMAT if name == ANY_NAME else PLAIN_SCOPE)
    if not NAMESPACE.fullmatch(namespace) or not name:
        raise ValueError(SCOPE_FORMAT)
    return Scope(namespace, name)


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key; the key itself is never kept
    scopes: tuple[Scope, ...] | None  # None: everything

    @cached_property  # read on every request: computed once per key
    def namespaces(self) -> tuple[str, ...]:
        """The namespaces its scopes name, in the order first listed (none for an admin key): where
        its plain model names resolve."""
        return tuple(dict.fromkeys(scope.namespace for scope in self.scopes or ()))

    def allows(self, route: Route) -> bool:
        """Whether this key may call `route`."""
        return self.scopes is None or any(scope.covers(route) for scope in self.scopes)


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
    elif len(secret) < MIN_KEY_LENGTH:
        raise ValueError(f"line {number}: a key needs at least {MIN_KEY_LENGTH} characters (or write sha256:<hex>)")
    else:
        digest = hash_key(secret)
    scopes: tuple[Scope, ...] | None = None
    if len(parts) == 2:
        entries = [f for f in parts[1].split(",") if f]
        if not entries or any(f.startswith("#") for f in entries):
            raise ValueError(f"line {number}: {ENTRY_FORMAT}")
        try:
            scopes = tuple(dict.fromkeys(parse_scope(f) for f in entries))
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


def broken_keys_refusal() -> OpenAIError:
    """Never the file's content nor its error: both may hold a key."""
    return OpenAIError(
        403,
        "This gateway's API keys file does not parse, so it refuses every request until the file is fixed.",
        type="permission_error",
        code="api_keys_invalid",
    )


class KeyRing:
    """The configured keys, or None when no keys file is configured (access control off). A keys file
    turns access control on whatever it holds: an empty list of keys refuses everyone, and so does a
    `broken` ring (the file did not parse: KeyRing.broken)."""

    def __init__(self, keys: list[ApiKey] | None = None, *, broken: bool = False) -> None:
        self.enabled = keys is not None or broken
        self.broken = broken
        self.keys = [] if broken else list(keys or [])
        # By hash: one lookup per request however many teams hold keys (a later entry wins, as it did).
        self._by_digest = {key.digest: key for key in self.keys}

    @classmethod
    def unparsable(cls) -> KeyRing:
        """A keys file that does not parse: every request refused (403 api_keys_invalid)."""
        return cls(broken=True)

    def find(self, presented: str) -> ApiKey | None:
        """The key whose hash matches. Looked up by the presented key's SHA-256, never by the key itself: how
        long the lookup takes depends on that hash, which a caller cannot steer towards a stored one, so timing
        tells nothing about the keys (comparing every stored hash per request cost O(keys) per request)."""
        return self._by_digest.get(hash_key(presented))

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The caller's key from `Authorization: Bearer ...`; None when access control is off."""
        if not self.enabled:
            return None
        if self.broken:
            raise broken_keys_refusal()
        if not self.keys:
            raise no_keys_refusal()
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise OpenAIError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")
        key = self.find(token.strip())
        if key is None:
            raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return key


def authorize(key: ApiKey | None, route: Route, requested: str) -> None:
    """404 unless `key` (None: access control off) may call `route`, which `requested` resolved to.

    The very answer a missing model gets (as OpenAI does): a 403 would tell one team which names exist in
    another team's namespace."""
    if key is not None and not key.allows(route):
        raise model_not_found(requested)


def route_for(key: ApiKey | None, table: RouteTable, requested: str) -> Route:
    """The route a request of `key` for `requested` goes to, authorised; OpenAIError 404 or 400
    (ambiguous_model) otherwise. A scoped key's plain names resolve in its own namespaces."""
    if key is None:
        route = resolve_name(table, requested)
    else:
        route = resolve_name(table, requested, key.namespaces, key.allows)
    authorize(key, route, requested)
    return route


def names_for(key: ApiKey | None, table: RouteTable) -> list[tuple[str, Route]]:
    """What /v1/models lists for `key`: each route it may call, named as it would resolve it."""
    if key is None:
        return visible_names(table)
    return visible_names(table, key.namespaces, key.allows)
