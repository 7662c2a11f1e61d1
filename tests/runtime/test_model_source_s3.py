"""s3:// sources fetched from a real S3-compatible store (SeaweedFS, tests/support/s3_server.py) into the cache.

Downloads are counted from the store's own log (one `GetObjectHandler` line per object GET it served) and, for
a resumed transfer, from the bytes that crossed a proxy on the wire: never from the runtime's own counters.
"""

from __future__ import annotations

import filecmp
import json
import threading
import time
from pathlib import Path

import pytest

from servlane_api.s3_source import S3Settings
from servlane_runtime.model_source import ModelSourceError, resolve_model_source
from servlane_runtime.sources import cache
from servlane_runtime.sources.s3 import fetch
from tests.support import s3_server as s3_fixtures
from tests.support.s3_server import S3Server, StallingProxy

s3_server = s3_fixtures.s3_server  # the module's SeaweedFS

BUCKET = "models"
PREFIX = "tiny/llama"
SOURCE = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture(scope="module")
def uploaded(s3_server: S3Server, tiny_llama_dir: Path) -> list[str]:
    return s3_server.upload_dir(tiny_llama_dir, BUCKET, PREFIX)


@pytest.fixture
def admin_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.admin.env().items():
        monkeypatch.setenv(name, value)


def settings(endpoint: str, stall: float = 60) -> S3Settings:
    return S3Settings(endpoint=endpoint, region="us-east-1", path_style=True, stall_timeout_seconds=stall)


def gets_of(server: S3Server, keys: list[str]) -> dict[str, int]:
    seen = server.object_gets(BUCKET)
    return {key: seen.count(key) for key in keys}


def same_files(local: Path, fetched: Path) -> bool:
    names = sorted(p.name for p in local.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(local, fetched, names, shallow=False)
    return not mismatch and not errors and sorted(p.name for p in fetched.iterdir()) == names


@pytest.mark.usefixtures("admin_env")
def test_every_file_is_fetched_once_and_a_complete_cache_fetches_nothing(
    s3_server: S3Server, uploaded: list[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    before = gets_of(s3_server, uploaded)
    path = Path(resolve_model_source(SOURCE, str(tmp_path), settings(s3_server.endpoint)))
    assert same_files(tiny_llama_dir, path)
    assert gets_of(s3_server, uploaded) == {key: before[key] + 1 for key in uploaded}
    marker = json.loads((path.parent / cache.MARKER).read_text())
    assert marker["source"] == SOURCE
    assert set(marker["files"]) == {key.rsplit("/", 1)[1] for key in uploaded}

    again = Path(resolve_model_source(SOURCE, str(tmp_path), settings(s3_server.endpoint)))
    assert again == path
    assert gets_of(s3_server, uploaded) == {key: before[key] + 1 for key in uploaded}  # nothing downloaded


@pytest.mark.usefixtures("admin_env")
def test_a_stalled_transfer_fails_in_seconds_and_the_next_fetch_resumes_it_with_a_range(
    s3_server: S3Server, uploaded: list[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    weights = tiny_llama_dir / "model.safetensors"
    total = sum(p.stat().st_size for p in tiny_llama_dir.iterdir())
    upstream = ("127.0.0.1", int(s3_server.endpoint.rsplit(":", 1)[1]))
    # The answers stop after ~700 kB: inside model.safetensors (1.8 MB), the files before it sorted by name.
    with StallingProxy(upstream, budget=700_000) as proxy:
        started = time.monotonic()
        with pytest.raises(ModelSourceError) as failed:
            fetch(SOURCE, str(tmp_path), settings(proxy.endpoint, stall=2))
        took = time.monotonic() - started
        assert took < 15, f"a stalled transfer took {took:.1f}s to fail"
        message = str(failed.value)
        assert message.startswith(f"{SOURCE}/model.safetensors: stalled: no data for 2s"), message
        entry = cache.entry_dir(str(tmp_path), "s3", proxy.endpoint, SOURCE)
        assert not (entry / cache.MARKER).exists()  # half written: never loaded
        (part,) = (entry / "incoming").glob("model.safetensors.*.partial")
        kept = part.stat().st_size
        assert 100_000 < kept < weights.stat().st_size

        gets_before = s3_server.object_gets(BUCKET).count(f"{PREFIX}/model.safetensors")
        proxy.reset()  # the network heals; the same endpoint, so the same cache entry
        path = Path(fetch(SOURCE, str(tmp_path), settings(proxy.endpoint)))
        delivered = proxy.delivered
    assert same_files(tiny_llama_dir, path)
    # Only what was missing crossed the wire (plus the listing's and the answers' headers): the bytes kept
    # were not fetched again, nor the files completed before the stall.
    assert delivered < total - kept + 20_000, (delivered, total, kept)
    assert s3_server.object_gets(BUCKET).count(f"{PREFIX}/model.safetensors") == gets_before + 1


@pytest.mark.usefixtures("admin_env")
def test_two_fetches_at_once_on_one_cache_fetch_each_file_once(
    s3_server: S3Server, uploaded: list[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    before = gets_of(s3_server, uploaded)
    results: list[str | BaseException] = []

    def fetch_into_the_shared_cache() -> None:
        try:
            results.append(fetch(SOURCE, str(tmp_path), settings(s3_server.endpoint)))
        except BaseException as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=fetch_into_the_shared_cache) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 2, results
    assert all(isinstance(r, str) for r in results), results
    assert results[0] == results[1]
    assert same_files(tiny_llama_dir, Path(str(results[0])))
    assert gets_of(s3_server, uploaded) == {key: before[key] + 1 for key in uploaded}


@pytest.mark.usefixtures("admin_env")
def test_a_cache_without_its_marker_is_fetched_again_and_files_the_store_no_longer_lists_go(
    s3_server: S3Server, uploaded: list[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = Path(fetch(SOURCE, str(tmp_path), settings(s3_server.endpoint)))
    (path / "model.safetensors").write_bytes(b"half written")
    (path / "old-shard.safetensors").write_bytes(b"from an older version")
    (path.parent / cache.MARKER).unlink()  # as a fetch that died before its end leaves it
    before = gets_of(s3_server, uploaded)
    again = Path(fetch(SOURCE, str(tmp_path), settings(s3_server.endpoint)))
    assert same_files(tiny_llama_dir, again)
    assert gets_of(s3_server, uploaded) == {key: before[key] + 1 for key in uploaded}


def test_object_names_that_would_leave_the_cache_are_refused() -> None:
    from servlane_runtime.sources.s3 import S3Path, _safe_name

    path = S3Path("b", "p")
    assert _safe_name(path, "sub/config.json") == "sub/config.json"
    for name in ("../escape", "a/../../escape", "a//b", "./x", "a/.", "x\x00y"):
        with pytest.raises(ModelSourceError, match="not a safe relative path"):
            _safe_name(path, name)


def test_one_of_the_two_keys_alone_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKONLYTHEID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(ModelSourceError, match="AWS_SECRET_ACCESS_KEY is not set"):
        fetch(SOURCE, str(tmp_path), settings("http://127.0.0.1:9"))


def test_a_store_that_cannot_be_reached_is_named_after_bounded_retries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.support.ports import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKSOMEKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "some-secret-value")
    started = time.monotonic()
    with pytest.raises(ModelSourceError) as failed:
        fetch(SOURCE, str(tmp_path), settings(f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    assert time.monotonic() - started < 15
    assert str(failed.value).startswith(f"{SOURCE}: cannot reach the store: "), failed.value
    assert "Connection refused" in str(failed.value)


def test_query_strings_never_reach_a_message() -> None:
    from servlane_runtime.sources.errors import without_query_strings

    signed = (
        "GET https://b.s3.amazonaws.com/k/model.safetensors?X-Amz-Credential=AKIA%2F20261205&X-Amz-Signature=f00d "
        "failed; retried /b/k?partNumber=1&X-Amz-Security-Token=tok"
    )
    assert without_query_strings(signed) == ("GET https://b.s3.amazonaws.com/k/model.safetensors failed; retried /b/k")


@pytest.mark.parametrize("status", [200, 404])
def test_an_endpoint_that_is_no_s3_store_is_named_without_copying_its_answer(
    status: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Team B pointing its endpoint at team A's service must not read team A's answers in its own status."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Private(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>team-a private page</html>"
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Private)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ModelSourceError) as failed:
            fetch(SOURCE, str(tmp_path), settings(f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
        server.server_close()
    message = str(failed.value)
    assert message.startswith(f"{SOURCE}: not an S3 answer"), message
    assert "private" not in message


GGUF_PREFIX = "gguf/two-quantizations"


@pytest.fixture(scope="module")
def gguf_folder(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A GGUF folder as such stores hold them: a file per quantization and a README, no config.json (the bytes
    need not be GGUF here: the engine checks the magic, the fetch only what to fetch)."""
    files = {"model-Q4_K_M.gguf": b"GGUF q4" * 1000, "model-Q8_0.gguf": b"GGUF q8" * 2000, "README.md": b"# m"}
    local = tmp_path_factory.mktemp("gguf-folder")
    for name, data in files.items():
        (local / name).write_bytes(data)
    s3_server.upload_dir(local, BUCKET, GGUF_PREFIX)
    return files


@pytest.mark.usefixtures("admin_env")
def test_a_named_gguf_file_is_the_only_object_fetched(
    s3_server: S3Server, gguf_folder: dict[str, bytes], tmp_path: Path
) -> None:
    source = f"s3://{BUCKET}/{GGUF_PREFIX}"
    keys = [f"{GGUF_PREFIX}/{name}" for name in gguf_folder]
    before = gets_of(s3_server, keys)
    got = Path(resolve_model_source(source, str(tmp_path), settings(s3_server.endpoint), "model-Q4_K_M.gguf", True))
    assert sorted(p.name for p in got.iterdir()) == ["model-Q4_K_M.gguf"]
    assert (got / "model-Q4_K_M.gguf").read_bytes() == gguf_folder["model-Q4_K_M.gguf"]
    fetched = {key: gets_of(s3_server, keys)[key] - before[key] for key in keys}
    assert fetched == {key: int(key.endswith("Q4_K_M.gguf")) for key in keys}
    # The other quantization, for another model on the same cache: an entry of its own, the first one kept.
    other = Path(resolve_model_source(source, str(tmp_path), settings(s3_server.endpoint), "model-Q8_0.gguf", True))
    assert other != got
    assert sorted(p.name for p in other.iterdir()) == ["model-Q8_0.gguf"]
    assert (got / "model-Q4_K_M.gguf").is_file()
    with pytest.raises(ModelSourceError, match=r"model-Q2_K\.gguf: no such object \(3 objects: README.md, model-Q4"):
        resolve_model_source(source, str(tmp_path), settings(s3_server.endpoint), "model-Q2_K.gguf", True)


@pytest.mark.usefixtures("admin_env")
def test_a_gguf_folder_without_a_named_file_needs_exactly_one(
    s3_server: S3Server, gguf_folder: dict[str, bytes], uploaded: list[str], tmp_path: Path
) -> None:
    keys = [f"{GGUF_PREFIX}/{name}" for name in gguf_folder]
    before = gets_of(s3_server, keys)
    # Two quantizations: which one is the user's to say, before any byte is fetched.
    with pytest.raises(ModelSourceError, match=r"holds 2 \(.*\): name it in engineOptions.llamacpp.ggufFile"):
        resolve_model_source(f"s3://{BUCKET}/{GGUF_PREFIX}", str(tmp_path), settings(s3_server.endpoint), gguf=True)
    assert gets_of(s3_server, keys) == before
    # One .gguf beside other files: that one, alone, and no config.json asked for.
    one = tmp_path / "one"
    one.mkdir()
    (one / "model-Q4_K_M.gguf").write_bytes(gguf_folder["model-Q4_K_M.gguf"])
    (one / "README.md").write_bytes(b"# m")
    s3_server.upload_dir(one, BUCKET, "gguf/one")
    got = Path(resolve_model_source(f"s3://{BUCKET}/gguf/one", str(tmp_path), settings(s3_server.endpoint), gguf=True))
    assert sorted(p.name for p in got.iterdir()) == ["model-Q4_K_M.gguf"]
    # A model folder with no .gguf at all (the tiny Llama's safetensors) is no source for the llama.cpp engine.
    with pytest.raises(ModelSourceError, match=r"holds 0 \("):
        resolve_model_source(SOURCE, str(tmp_path), settings(s3_server.endpoint), gguf=True)
