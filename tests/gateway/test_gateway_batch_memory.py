"""A large upload and its download pass through the gateway chunk by chunk: the process's memory (traced
Python allocations, as tracemalloc sees them while the gateway serves in this process) grows by far less
than the file, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import hashlib
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.batch import gateway
from tests.support.batch_databases import Postgres
from tests.support.gateway_harness import StartGateway, Upstream

KEY = "sk-alpha-00000000000000000000000"
MIB = 1 << 20
FILE_MIB = 50
MOST_GROWTH = 20 * MIB  # far below the file: a copy of it anywhere would break this
BOUNDARY = "m3mory"
PIECE = bytes(range(256)) * (MIB // 256)


def upload_body() -> Iterator[bytes]:
    """A 50 MiB file in a multipart form, made as it is sent (the same MiB over and over: the test's own
    side allocates next to nothing)."""
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
    ).encode()
    for _ in range(FILE_MIB):
        yield PIECE
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'batch.db'}"
    server: Postgres = request.getfixturevalue("postgres")
    return server.new_database(f"mem_{uuid.uuid4().hex[:12]}")


def test_a_large_upload_and_its_download_never_hold_the_file_in_memory(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path, database_url: str
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path, batch_database_url=database_url,
                 batch_max_file_bytes=64 * MIB, batch_max_owner_bytes=128 * MIB)  # fmt: skip
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=120) as client:
        assert client.get("/v1/files").status_code == 200  # the Batch API is up before measuring
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            uploaded = client.post(
                "/v1/files",
                content=upload_body(),
                headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
            )
            upload_peak = tracemalloc.get_traced_memory()[1] - before
            assert uploaded.status_code == 200, uploaded.text
            file = uploaded.json()
            assert file["bytes"] == FILE_MIB * MIB
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            digest, received = hashlib.sha256(), 0
            with client.stream("GET", f"/v1/files/{file['id']}/content") as download:
                assert download.status_code == 200
                for data in download.iter_bytes():
                    digest.update(data)
                    received += len(data)
            download_peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    assert received == FILE_MIB * MIB
    assert digest.hexdigest() == hashlib.sha256(PIECE * FILE_MIB).hexdigest()
    assert upload_peak < MOST_GROWTH, f"the upload took {upload_peak / MIB:.1f} MiB"
    assert download_peak < MOST_GROWTH, f"the download took {download_peak / MIB:.1f} MiB"
