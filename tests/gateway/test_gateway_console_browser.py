"""The console in a real browser (Debian's headless Chromium) against a running gateway with tracing on:
the page finds the features, draws a canary chart (uPlot's canvas) and links a failed request to its trace.
Screenshots are kept under .artifacts/console/ (CI keeps .artifacts/).

The gateway runs without keys: a key must never be in a URL, and `--dump-dom` can only be given one. Key
handling of the same JSON is tested with httpx (test_gateway_console.py). Without Chromium the test skips
locally and fails with CI=true, as for every real component.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servlane_gateway.app import create_app
from servlane_gateway.settings import GatewaySettings
from tests.support.console import console_objects
from tests.support.gateway_harness import ServedApp, Upstream, aifeature

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "console"
TRACES = "http://jaeger.test:16686/trace/{trace_id}"
BROWSER_SECONDS = 60
# Names come from users: a name that is markup must show as text, never become an element.
HOSTILE = '<img id="injected" src="x">'


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        message = "no chromium on PATH (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"chromium is required in CI: {message}")
        pytest.skip(message)
    return found


@pytest.fixture
def traced_gateway(tmp_path: Path, upstreams: dict[str, Upstream]) -> Iterator[str]:
    from opentelemetry.sdk.trace import TracerProvider

    routes = tmp_path / "routes.json"
    objects = [*console_objects(upstreams["v1"].url, upstreams["v2"].url), aifeature(HOSTILE, [("chat-v1", 100)])]
    routes.write_text(json.dumps(objects))
    settings = GatewaySettings(routes_file=routes, console_slow_seconds=30, trace_url_template=TRACES)
    app = create_app(settings)
    # A provider of its own, exporting nowhere: the responses carry trace ids, no global state is touched.
    app.trace_with(TracerProvider().get_tracer("console-test"))  # type: ignore[attr-defined]
    with ServedApp(app) as served:
        yield served.url


def browse(chromium: str, profile: Path, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    argv += [f"--user-data-dir={profile}", "--window-size=1280,1800", "--virtual-time-budget=5000", *flags, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=BROWSER_SECONDS, check=True)


def test_console_shows_features_a_canary_chart_and_trace_links(
    chromium: str, traced_gateway: str, tmp_path: Path
) -> None:
    url = traced_gateway
    ok = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert ok.status_code == 200
    failing = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "summary", "messages": [{"role": "user", "content": "status=502"}]},
    )
    assert failing.status_code == 502
    trace_id = failing.headers["x-trace-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id)

    dom = browse(chromium, tmp_path / "profile", f"{url}/console", "--dump-dom").stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "console.html").write_text(dom)
    features = re.search(r'<table id="features">.*?</table>', dom, re.S)
    assert features is not None
    assert "<td>chat</td>" in features.group(0)
    assert "<td>summary</td>" in features.group(0)
    chart = re.search(r'data-feature="default/chat".*?class="canary-chart".*?<canvas', dom, re.S)
    assert chart is not None, "no uPlot canvas in the chat feature's canary chart"
    link = f'<a href="http://jaeger.test:16686/trace/{trace_id}" class="trace-link"'
    assert link in dom
    assert "secret-model" in dom  # no keys: everything shows
    cold = re.search(r'<span title="pod model-chat-v1-b\n(.*?)" class="cold-start">(.*?)</span>', dom, re.S)
    assert cold is not None, "no cold start cell for chat-v1"
    assert cold.group(2) == "14.00 s (median 12.00 s)"
    assert cold.group(1).split("\n") == [
        "scheduled: 1.00 s",
        "engine loaded: 6.50 s",
        "probe to Ready: 500 ms",
        "2 recent start(s)",
    ]
    assert '&lt;img id="injected"' in dom  # shown as text
    assert '<img id="injected"' not in dom  # never an element

    screenshot = ARTIFACTS / "console.png"
    screenshot.unlink(missing_ok=True)
    browse(chromium, tmp_path / "profile", f"{url}/console", f"--screenshot={screenshot}")
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
