"""s3://bucket/prefix into the cache dir, from any S3-compatible store, with MinIO's client (minio-py).

(boto3 cannot be installed beside the operator's kubernetes client: botocore pins python-dateutil below 3,
kubernetes needs 3 or later.)

Credentials only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, which the
operator fills from source.credentialsSecret); none: anonymous requests, for a public bucket. Every file under
the prefix is fetched to `incoming/` (a transfer cut short is resumed with a ranged GET, If-Match its ETag),
checked against the listed size and, for a single-part ETag, its MD5, then moved into `model/`; the entry's
completion marker is written last (see .cache). A socket that delivers no byte for `stall_timeout_seconds`
fails the fetch; connections and 5xx answers are retried a bounded number of times.
Every failure is a ModelSourceError that starts with `s3://bucket/key:` and the store's own code and message.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn
from urllib.parse import urlsplit
from xml.etree.ElementTree import ParseError

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util import Retry, Timeout

from servlane_api.s3_source import S3Settings

from . import cache
from .cache import Listed
from .errors import ModelSourceError, without_query_strings

log = logging.getLogger(__name__)

AWS_ENDPOINT = "s3.amazonaws.com"
CONNECT_TIMEOUT_SECONDS = 10
# Bounded retries: a refused or reset connection and a 5xx answer are tried again (with backoff), a request
# that stalls before its first byte at most once more; then the fetch fails with what the store said.
RETRIES = Retry(
    total=3,
    connect=3,
    read=1,
    status=3,
    backoff_factor=0.5,
    status_forcelist=(500, 502, 503, 504),
    allowed_methods=("GET", "HEAD"),
    raise_on_status=False,  # the last answer goes back to the client, which reads the store's error from it
)
CHUNK_BYTES = 1 << 20
# An ETag that is the object's MD5 (a single-part upload without SSE-KMS/SSE-C) can be checked.
_SIMPLE_ETAG = re.compile(r"^[0-9a-f]{32}$")
_KMS_OR_CUSTOMER_KEY = ("aws:kms", "aws:kms:dsse")


@dataclass(frozen=True)
class S3Path:
    bucket: str
    prefix: str  # '' for the whole bucket, else without a trailing '/'

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key_uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def join(self, name: str) -> str:
        """The key of `name` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name


def parse_s3_uri(source: str) -> S3Path:
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    if not bucket:
        raise ModelSourceError(f"invalid model source {source!r}: expected s3://bucket/prefix")
    return S3Path(bucket, prefix.strip("/"))


def fetch(source: str, cache_dir: str, settings: S3Settings, only_file: str | None = None, gguf: bool = False) -> str:
    """The local directory holding the files under `source` the engine reads; fetches what the cache lacks
    (blocking). All of them (a model with its config.json), or `only_file`, or with `gguf` its one .gguf file:
    a GGUF folder often holds a file per quantization, gigabytes each, of which a model loads one."""
    path = parse_s3_uri(source)
    endpoint = settings.endpoint or f"https://{AWS_ENDPOINT}"
    # One entry per selection: two models that read different files of one prefix never remove each other's.
    selection = f"{path.uri}#{only_file}" if only_file else f"{path.uri}#*.gguf" if gguf else path.uri
    entry = cache.entry_dir(cache_dir, "s3", endpoint, selection)
    client = _client(settings)
    try:
        with cache.exclusive(entry, path.uri):
            listing = select(path, _list(client, path), only_file, gguf)
            if cache.is_complete(entry, listing):
                log.info("%s: the cache holds all %d files (%s): nothing to fetch", path.uri, len(listing), entry)
                return str(entry / "model")
            _fill(client, path, entry, listing, settings.stall_timeout_seconds)
    except OSError as exc:
        raise ModelSourceError(f"{path.uri}: the cache dir {cache_dir} cannot be used: {exc}") from exc
    return str(entry / "model")


def _client(settings: S3Settings) -> Minio:
    if settings.endpoint is None:
        host, secure = AWS_ENDPOINT, True
    else:
        url = urlsplit(settings.endpoint)
        host, secure = url.netloc, url.scheme == "https"
    access_key = os.environ.get("AWS_ACCESS_KEY_ID") or None
    secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY") or None
    if (access_key is None) != (secret_key is None):
        missing = "AWS_SECRET_ACCESS_KEY" if secret_key is None else "AWS_ACCESS_KEY_ID"
        raise ModelSourceError(f"s3 credentials: {missing} is not set (the credentialsSecret needs both keys)")
    http = urllib3.PoolManager(
        timeout=Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=settings.stall_timeout_seconds),
        retries=RETRIES,
        maxsize=4,
        ca_certs=os.environ.get("SSL_CERT_FILE") or None,
    )
    client = Minio(
        host,
        access_key=access_key,
        secret_key=secret_key,
        session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
        secure=secure,
        region=settings.region,
        http_client=http,
    )
    # minio-py's own choice (virtual-hosted on AWS, path-style elsewhere) unless the source says.
    if settings.path_style is True:
        client.disable_virtual_style_endpoint()  # type: ignore[no-untyped-call]
    elif settings.path_style is False:
        client.enable_virtual_style_endpoint()  # type: ignore[no-untyped-call]
    return client


def _list(client: Minio, path: S3Path) -> dict[str, Listed]:
    """Every file under the prefix, by its path relative to it; a listing that is no model fails here."""
    prefix = f"{path.prefix}/" if path.prefix else ""
    listing: dict[str, Listed] = {}
    try:
        for obj in client.list_objects(path.bucket, prefix=prefix or None, recursive=True):
            name = (obj.object_name or "").removeprefix(prefix)
            if obj.is_dir or name.endswith("/") or not name:
                continue  # a folder marker
            listing[_safe_name(path, name)] = Listed(int(obj.size or 0), (obj.etag or "").strip('"'))
    except (MinioException, Urllib3Error, ParseError, ValueError) as exc:  # ValueError: XML that is not S3's
        _fail(path.uri, exc, None)
    if not listing:
        raise ModelSourceError(f"{path.uri}: no object under this prefix (the store lists nothing there)")
    return listing


def select(path: S3Path, listing: dict[str, Listed], only_file: str | None, gguf: bool) -> dict[str, Listed]:
    """The files to fetch, chosen before any is (see fetch); a listing without them fails here, naming what
    it holds."""
    if only_file is not None:
        if only_file not in listing:
            raise ModelSourceError(f"{path.key_uri(path.join(only_file))}: no such object ({_some(listing)})")
        return {only_file: listing[only_file]}
    if gguf:
        found = sorted(name for name in listing if name.endswith(".gguf") and "/" not in name)
        if len(found) != 1:
            raise ModelSourceError(
                f"{path.uri}: the llama.cpp engine loads one .gguf file and this prefix holds {len(found)} "
                f"({_some(listing)}): name it in engineOptions.llamacpp.ggufFile"
            )
        return {found[0]: listing[found[0]]}
    if "config.json" not in listing:
        raise ModelSourceError(f"{path.uri}: not a model: no config.json under this prefix ({_some(listing)})")
    return listing


def _some(listing: dict[str, Listed]) -> str:
    """What a listing holds, in a message: its count and first names."""
    names = sorted(listing)
    return f"{len(names)} objects: " + ", ".join(names[:5]) + (", …" if len(names) > 5 else "")


def _safe_name(path: S3Path, name: str) -> str:
    """Object names come from the store: one that would land outside the entry (.., absolute, empty parts)
    is refused rather than written."""
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\x00" in name:
        raise ModelSourceError(f"{path.key_uri(name)}: refused: the object name is not a safe relative path")
    return name


def _fill(client: Minio, path: S3Path, entry: Path, listing: dict[str, Listed], stall: float) -> None:
    """Fetch what `model/` lacks into `incoming/`; only once all of it is there and verified does `model/`
    change (marker removed, files moved in, unlisted files removed, marker written), so an interrupted fill
    leaves the previous complete version as it was and its transfers to be resumed."""
    model, incoming = entry / "model", entry / "incoming"
    before = cache.read_marker(entry) or {}
    wanted = {
        name: listed
        for name, listed in listing.items()
        if not (before.get(name) == listed and cache.size_of(model / name) == listed.size)
    }
    ready = {name: _fetch_one(client, path, name, listed, incoming, stall) for name, listed in sorted(wanted.items())}
    cache.forget_marker(entry)
    for name, part in ready.items():
        cache.publish(part, model / name)
    cache.remove_unlisted(entry, listing)
    cache.write_marker(entry, path.uri, listing)
    shutil.rmtree(incoming, ignore_errors=True)  # what is left there is of versions no longer listed
    log.info("%s: fetched %d of %d files into %s", path.uri, len(ready), len(listing), entry)


def _fetch_one(client: Minio, path: S3Path, name: str, listed: Listed, incoming: Path, stall: float) -> Path:
    """The object, verified, in `incoming/` (its name tagged with the ETag, so a transfer is only ever resumed
    from bytes of the same version); resumes what an earlier attempt left there."""
    key = path.join(name)
    tag = re.sub(r"[^A-Za-z0-9-]", "_", listed.etag)[:80] or "none"
    part = incoming / f"{name}.{tag}.partial"
    part.parent.mkdir(parents=True, exist_ok=True)
    for other in part.parent.glob(f"{glob.escape(Path(name).name)}.*.partial"):
        if other != part:
            other.unlink()  # a transfer of another version of the object
    offset = cache.size_of(part) or 0
    if offset > listed.size:
        part.unlink()
        offset = 0
    md5 = hashlib.md5(usedforsecurity=False)
    if offset:
        with part.open("rb") as done:
            for chunk in iter(lambda: done.read(CHUNK_BYTES), b""):
                md5.update(chunk)
        if offset < listed.size:
            log.info("%s: resuming at byte %d of %d", path.key_uri(key), offset, listed.size)
    checkable = _SIMPLE_ETAG.fullmatch(listed.etag) is not None
    with part.open("ab") as out:
        if offset < listed.size:
            checkable &= _transfer(client, path, key, listed, offset, out, md5, stall)
    got = part.stat().st_size
    if got != listed.size:
        raise ModelSourceError(
            f"{path.key_uri(key)}: the transfer ended at byte {got} of {listed.size} (kept: the next start resumes it)"
        )
    if checkable and md5.hexdigest() != listed.etag:
        part.unlink()
        raise ModelSourceError(
            f"{path.key_uri(key)}: the data's MD5 {md5.hexdigest()} is not its ETag {listed.etag} (discarded: the "
            "next start fetches it again)"
        )
    return part


def _transfer(
    client: Minio, path: S3Path, key: str, listed: Listed, offset: int, out: BinaryIO, md5: Any, stall: float
) -> bool:
    """Append the object's bytes from `offset` on (a ranged GET, If-Match its ETag) to `out`; False when its
    ETag is not its MD5 (SSE-KMS or SSE-C objects)."""
    # Resumed bytes and new ones must be of one version: a changed object answers 412 PreconditionFailed.
    headers: dict[str, str | list[str] | tuple[str]] | None = {"If-Match": f'"{listed.etag}"'} if listed.etag else None
    try:
        response = client.get_object(path.bucket, key, offset=offset, request_headers=headers)
    except (MinioException, Urllib3Error) as exc:
        _fail(path.key_uri(key), exc, stall)
    try:
        # read1: what has arrived, at once; so the bytes before a stall are kept for the next start to resume.
        while chunk := response.read1(CHUNK_BYTES, decode_content=False):
            out.write(chunk)
            md5.update(chunk)
    except (MinioException, Urllib3Error) as exc:
        out.flush()
        _fail(path.key_uri(key), exc, stall)
    finally:
        response.close()
        response.release_conn()
    encryption = response.headers.get("x-amz-server-side-encryption", "")
    return encryption not in _KMS_OR_CUSTOMER_KEY and not response.headers.get(
        "x-amz-server-side-encryption-customer-algorithm"
    )


def _fail(where: str, exc: Exception, stall: float | None) -> NoReturn:
    raise ModelSourceError(f"{where}: {_describe(exc, stall)}") from exc


def _describe(exc: Exception, stall: float | None) -> str:
    """The store's own words (its error code and message), or what went wrong on the way; no query strings."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, S3Error):
        text = f"{exc.code}: {exc.message}"
    elif isinstance(exc, ParseError | ValueError):
        text = "not an S3 answer: the listing is not S3's XML; is the endpoint an S3 store?"
    elif isinstance(exc, InvalidResponseError):
        # Not the body: an endpoint that is no S3 store (another tenant's service, say) must not have its
        # answer copied into this AIModel's status.
        code, kind = getattr(exc, "_code", "?"), getattr(exc, "_content_type", None)
        text = f"not an S3 answer: HTTP {code} ({kind or 'no content type'}); is the endpoint an S3 store?"
    elif isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        text = f"stalled: no data for {stall:g}s (stallTimeoutSeconds)" if stall else f"timed out: {exc}"
    elif isinstance(exc, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError):
        text = f"cannot reach the store: {exc}"
    elif isinstance(exc, urllib3.exceptions.ProtocolError):
        text = f"the connection broke: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    return without_query_strings(text)
