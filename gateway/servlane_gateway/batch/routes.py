"""The Batch API's HTTP endpoints, shaped as OpenAI's (`client.files`, `client.batches` of the openai SDK).

Every object belongs to the API key that created it (its name): another key gets the 404 a missing object
gets. Without a database the endpoints answer an OpenAI-style 404 saying the Batch API is not configured,
after authentication (so nothing is ever served open). Without API keys there is no owner to tell callers
apart, so the endpoints answer 403 `batch_api_needs_keys` unless the gateway was told it has one user
(--batch-allow-without-keys; then everyone is the one owner "").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.exc import DataError, DBAPIError
from starlette.requests import ClientDisconnect

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.batch import rules
from servlane_gateway.batch.files import FILE_CHUNK, FileGone, QuotaExceeded
from servlane_gateway.batch.store import BatchStore
from servlane_gateway.batch.upload_form import UploadForm
from servlane_gateway.http.request import read_capped
from servlane_gateway.state import GatewayState

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
RETRY_AFTER = 5.0
UPLOAD_CHUNK = FILE_CHUNK  # an upload is written in the chunks the store keeps
# Uploads received at once by a replica, and by one key (the defaults of --batch-uploads-at-once and
# --batch-uploads-at-once-per-key): each holds a database connection and a chunk in memory while its sender
# is sending. More wait (503 with Retry-After); one key cannot take every place with slow uploads.
UPLOADS_AT_ONCE = 4
UPLOADS_AT_ONCE_PER_KEY = 2
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the purpose field, on top of the file itself
# An upload must average this much once past its grace (64 kbit/s: a slow link passes, a trickle does not).
MIN_UPLOAD_RATE = 8 * 1024
UPLOAD_GRACE_SECONDS = 30.0
UPLOAD_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": [rules.INPUT_PURPOSE]},
                    },
                }
            }
        },
    }
}


# OpenAI's bounds on a batch's metadata: up to 16 pairs, keys of 64 characters, values of 512. Unbounded, one
# tenant's metadata (returned on every list page) filled the database and the gateway's memory.
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class BatchCreate(BaseModel):
    input_file_id: str = Field(max_length=64)
    endpoint: str = Field(max_length=64)
    completion_window: str = Field(max_length=16)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)


# The body's schema in the OpenAPI document (the handler reads the body itself, so FastAPI does not list it).
CREATE_SCHEMA: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": BatchCreate.model_json_schema()}}}
}


def batch_create(raw: bytes) -> BatchCreate:
    """The body of a batch's creation, or the 400 FastAPI's own parsing gave (servlane_web.errors): the same
    errors, located in the body."""
    try:
        return BatchCreate.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def not_configured() -> OpenAIError:
    return OpenAIError(
        404,
        "The Batch API is not configured on this gateway (it needs a database: --batch-database-url).",
        code="batch_api_not_configured",
    )


def too_large(cap: int) -> OpenAIError:
    return OpenAIError(413, f"The file is larger than {cap} bytes.", param="file", code="file_too_large")


def needs_keys() -> OpenAIError:
    message = (
        "The Batch API needs API keys on this gateway: files and batches belong to the key that created them, "
        "and without keys every caller would read everyone's (--keys-file; or --batch-allow-without-keys for a "
        "gateway with a single user)."
    )
    return OpenAIError(403, message, type="permission_error", code="batch_api_needs_keys")


def over_quota(exc: QuotaExceeded, what: str = "upload", param: str = "file") -> OpenAIError:
    """What is stored counts the owner's files and the copy of its input each unfinished batch keeps."""
    message = (
        f"This {what} of {exc.size} bytes would take what you store to {exc.used + exc.size} bytes, past your "
        f"quota of {exc.quota} bytes ({exc.used} in use: your files, and a copy of its input for each batch not "
        "yet ended): delete files you no longer need, or wait for your batches to end."
    )
    return OpenAIError(403, message, type="insufficient_quota", param=param, code="storage_quota_exceeded")


def uploads_busy() -> OpenAIError:
    message = "Too many uploads are being received right now; try again shortly."
    return OpenAIError(503, message, type="server_error", code="too_many_uploads", retry_after=RETRY_AFTER)


class UploadPlaces:
    """The places for uploads in progress on this replica (one event loop: no lock needed)."""

    def __init__(self, total: int, per_owner: int) -> None:
        self.total, self.per_owner = total, per_owner
        self.taken: dict[str, int] = {}

    @contextmanager
    def place(self, owner: str) -> Iterator[None]:
        """Holds a place while the body is received; a 503 with Retry-After when none is free."""
        if sum(self.taken.values()) >= self.total or self.taken.get(owner, 0) >= self.per_owner:
            raise uploads_busy()
        self.taken[owner] = self.taken.get(owner, 0) + 1
        try:
            yield
        finally:
            self.taken[owner] -= 1
            if not self.taken[owner]:
                del self.taken[owner]


def not_found(kind: str, object_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such {kind}: '{object_id}'.", type="invalid_request_error", param="id")


def unavailable() -> OpenAIError:
    message = "The Batch API's database does not answer; try again shortly."
    return OpenAIError(503, message, type="server_error", code="batch_api_unavailable", retry_after=RETRY_AFTER)


async def in_db(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A store call in a thread; a database that does not answer is a 503 with Retry-After, not a 500. A value
    the database refuses (PostgreSQL takes no NUL in text) is the caller's: a 400, never a 503 to retry."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except DataError:
        raise OpenAIError(400, "The request holds a value that cannot be stored (e.g. a NUL character).") from None
    except DBAPIError as exc:
        log.warning("the Batch API's database failed: %s", type(exc.orig).__name__ if exc.orig else exc)
        raise unavailable() from None


OwnerOf = Callable[[Request], tuple[BatchStore, str]]  # the caller's store and owner, or the refusal


def batch_router(
    state: GatewayState,
    store: BatchStore | None,
    max_file_bytes: int,
    wake: Callable[[], None],
    ready: Callable[[], bool],
    allow_without_keys: bool = False,
    uploads_at_once: int = UPLOADS_AT_ONCE,
    uploads_at_once_per_key: int = UPLOADS_AT_ONCE_PER_KEY,
) -> APIRouter:
    router = APIRouter()
    uploads = UploadPlaces(uploads_at_once, uploads_at_once_per_key)

    def owner_of(request: Request) -> tuple[BatchStore, str]:
        key = state.keys.authenticate(request.headers.get("authorization"))
        if store is None:
            raise not_configured()
        if key is None and not allow_without_keys:
            raise needs_keys()
        if not ready():
            raise unavailable()  # its schema is not migrated yet (the database did not answer at start)
        return store, key.name if key is not None else ""

    _add_file_routes(router, owner_of, uploads, max_file_bytes)
    _add_batch_routes(router, owner_of, wake, lambda: state.limits.max_body_bytes)
    return router


def _add_file_routes(router: APIRouter, owner_of: OwnerOf, uploads: UploadPlaces, max_file_bytes: int) -> None:
    """Files: upload (multipart, streamed into the database), list, retrieve, content, delete."""

    @router.post("/v1/files", openapi_extra=UPLOAD_SCHEMA)
    async def upload(request: Request) -> dict[str, Any]:
        # The body is read here, not by FastAPI before the call: the key is checked first, and a body
        # announced larger than the cap is refused before any of it is read; one that grows past it
        # (chunked, or a Content-Length that lied) as soon as it does. The file goes to the database in
        # chunks as it arrives: never whole in memory, never spooled to /tmp.
        db, owner = owner_of(request)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_file_bytes + FORM_OVERHEAD:
            raise too_large(max_file_bytes)
        with uploads.place(owner):
            return await _store_upload(request, db, owner, max_file_bytes)

    @router.get("/v1/files")
    async def list_files(
        request: Request, purpose: str | None = None, limit: int = 10000, after: str | None = None, order: str = "desc"
    ) -> dict[str, Any]:
        db, owner = owner_of(request)
        if order not in ("asc", "desc"):
            message = f"Invalid value for 'order': expected 'asc' or 'desc', got {order[:40]!r}."
            raise OpenAIError(400, message, param="order", code="invalid_value")
        if page_limit(limit, MAX_FILES_PAGE) == 0:
            return _page([], False)
        data, more = await in_db(db.list_files, owner, purpose, after, limit, order == "asc")
        return _page(data, more)

    @router.get("/v1/files/{file_id}")
    async def retrieve_file(request: Request, file_id: str) -> dict[str, Any]:
        db, owner = owner_of(request)
        found = await in_db(db.get_file, owner, file_id)
        if found is None:
            raise not_found("file", file_id)
        return found

    @router.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> StreamingResponse:
        db, owner = owner_of(request)
        found = await in_db(db.get_file, owner, file_id)
        if found is None:
            raise not_found("file", file_id)

        async def chunks() -> AsyncIterator[bytes]:
            # A stored chunk at a time: a large result file is never held whole by the gateway.
            index = 0
            while (chunk := await in_db(db.file_chunk, owner, file_id, index)) is not None:
                yield chunk  # none (any more): the end, or deleted meanwhile (the answer ends short)
                index += 1

        length = {"content-length": str(found["bytes"])}
        return StreamingResponse(chunks(), media_type="application/octet-stream", headers=length)

    @router.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        db, owner = owner_of(request)
        if not await in_db(db.delete_file, owner, file_id):
            raise not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}


def _add_batch_routes(
    router: APIRouter, owner_of: OwnerOf, wake: Callable[[], None], max_body_bytes: Callable[[], int]
) -> None:
    """Batches: create (the worker is woken), list, retrieve, cancel."""

    @router.post("/v1/batches", openapi_extra=CREATE_SCHEMA)
    async def create_batch(request: Request) -> dict[str, Any]:
        # The body is read here, not by FastAPI before the call: the key is checked first (a caller without one
        # had the gateway read and parse a body of any size), and the body is capped as every other one is.
        db, owner = owner_of(request)
        body = batch_create(await read_capped(request, max_body_bytes()))
        if body.endpoint not in rules.ENDPOINTS:
            message = f"The endpoint must be one of {', '.join(rules.ENDPOINTS)}."
            raise OpenAIError(400, message, param="endpoint", code="invalid_endpoint")
        if body.completion_window not in rules.COMPLETION_WINDOWS:
            message = f"The completion_window must be one of {', '.join(rules.COMPLETION_WINDOWS)}."
            raise OpenAIError(400, message, param="completion_window")
        found = await in_db(db.get_file, owner, body.input_file_id)
        if found is None:
            raise not_found("file", body.input_file_id)
        if found["purpose"] != rules.INPUT_PURPOSE:
            raise OpenAIError(400, f"The input file must have purpose '{rules.INPUT_PURPOSE}'.", param="input_file_id")
        try:
            created = await in_db(
                db.create_batch, owner, body.input_file_id, body.endpoint, body.completion_window, body.metadata,
                int(time.time()),
            )  # fmt: skip
        except FileGone:  # deleted since it was looked up
            raise not_found("file", body.input_file_id) from None
        except QuotaExceeded as exc:
            raise over_quota(exc, "batch's copy of its input", "input_file_id") from None
        wake()
        return created

    @router.get("/v1/batches")
    async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        db, owner = owner_of(request)
        if page_limit(limit, MAX_BATCHES_PAGE) == 0:
            return _page([], False)
        data, more = await in_db(db.list_batches, owner, after, limit)
        return _page(data, more)

    @router.get("/v1/batches/{batch_id}")
    async def retrieve_batch(request: Request, batch_id: str) -> dict[str, Any]:
        db, owner = owner_of(request)
        found = await in_db(db.get_batch, owner, batch_id)
        if found is None:
            raise not_found("batch", batch_id)
        return found

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
        db, owner = owner_of(request)
        try:
            found = await in_db(db.cancel_batch, owner, batch_id, int(time.time()))
        except rules.TransitionError as exc:
            raise OpenAIError(409, f"{exc}.", code="invalid_batch_status") from None
        if found is None:
            raise not_found("batch", batch_id)
        wake()
        return found


async def _store_upload(request: Request, db: BatchStore, owner: str, max_file_bytes: int) -> dict[str, Any]:
    """The multipart body into the database as it arrives, in chunks; the file's record, or the error."""
    form = UploadForm(request.headers.get("content-type", ""))
    file_id: str | None = None
    started = time.monotonic()
    try:
        received, index = 0, 0
        async for data in request.stream():
            received += len(data)
            if received > max_file_bytes + FORM_OVERHEAD:
                raise too_large(max_file_bytes)
            too_slow(received, time.monotonic() - started)
            form.feed(data)
            if form.filename is not None and file_id is None:
                file_id = await in_db(db.begin_file, owner, rules.INPUT_PURPOSE, form.filename, _now())
            if file_id is not None:
                for chunk in form.take(UPLOAD_CHUNK):
                    await in_db(db.append_chunk, file_id, index, chunk)
                    index += 1
        rest = form.end()
        if file_id is None:  # no file part: form.end() said so already
            raise OpenAIError(400, "Missing the file to upload (multipart field 'file').", param="file")
        if form.fields.get("purpose") != rules.INPUT_PURPOSE:
            message = f"Only purpose '{rules.INPUT_PURPOSE}' is supported here."
            raise OpenAIError(400, message, param="purpose")
        if rest:
            await in_db(db.append_chunk, file_id, index, rest)
        size = index * UPLOAD_CHUNK + len(rest)
        if size > max_file_bytes:
            raise too_large(max_file_bytes)
        try:
            return await in_db(db.finish_file, owner, file_id, size)
        except QuotaExceeded as exc:
            raise over_quota(exc) from None
    except ClientDisconnect:
        # The client left mid-upload: nothing to answer, and no error to log (any client could flood the log).
        log.debug("an upload ended with its client gone")
        await _discard(db, file_id)
        raise OpenAIError(499, "client closed the request", code="client_closed_request") from None
    except BaseException:
        await _discard(db, file_id)
        raise


async def _discard(db: BatchStore, file_id: str | None) -> None:
    if file_id is not None:  # its chunks go with it; one left by a dead process is swept later
        with suppress(Exception):
            await in_db(db.discard_file, file_id)


def too_slow(received: int, seconds: float) -> None:
    """A 408 for an upload that, past its first UPLOAD_GRACE_SECONDS, averages under MIN_UPLOAD_RATE. The server
    cuts a body that pauses for a minute, not one that trickles: a byte every 20 s held an upload place for as long
    as the client liked, and two keys holding theirs filled the replica's places for every other tenant."""
    if seconds > UPLOAD_GRACE_SECONDS and received < MIN_UPLOAD_RATE * seconds:
        message = f"The upload is too slow: under {MIN_UPLOAD_RATE // 1024} KiB/s on average."
        raise OpenAIError(408, message, code="upload_too_slow")


def _now() -> int:
    return int(time.time())


MAX_FILES_PAGE = 10_000  # OpenAI's bounds on `limit` of a list: files 0-10,000, batches 0-100
MAX_BATCHES_PAGE = 100


def page_limit(limit: int, maximum: int) -> int:
    """A list's `limit` as OpenAI takes it: 0 is an empty page (has_more false, so no paginator loops on it);
    below 0 or above `maximum` is a 400 in OpenAI's words (it was clamped, so a script got a page it never
    asked for, or an empty one claiming more)."""
    if limit < 0:
        message = f"Invalid 'limit': integer below minimum value. Expected a value >= 0, but got {limit} instead."
        raise OpenAIError(400, message, param="limit", code="integer_below_min_value")
    if limit > maximum:
        message = (
            f"Invalid 'limit': integer above maximum value. Expected a value <= {maximum}, but got {limit} instead."
        )
        raise OpenAIError(400, message, param="limit", code="integer_above_max_value")
    return limit


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    first = data[0]["id"] if data else None
    last = data[-1]["id"] if data else None
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}
