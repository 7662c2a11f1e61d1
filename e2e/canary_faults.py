"""Faults for the canary e2e scenarios (e2e/test_canary_full.py) and what they read back: a model that
answers every chat with a 400, a Prometheus that can be killed and started again on its own port, the
Events posted on an AIFeature, and the operator's own counters."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster_harness import Kube, wait_until

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def without_chat_template(model_dir: Path, target: Path) -> Path:
    """A copy of `model_dir` whose tokenizer has no chat template: the runtime answers every chat with a
    400 (and completions as before). Rebuilt each time, so a stale copy never hides the fault."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(model_dir, target)
    for name in TEMPLATE_FILES:
        (target / name).unlink(missing_ok=True)
    config_path = target / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config.pop("chat_template", None)
        config_path.write_text(json.dumps(config, indent=2))
    left = [name for name in TEMPLATE_FILES if (target / name).exists()]
    assert left == [], f"chat template files left in {target}: {left}"
    return target


def get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class PrometheusProcess:
    """The Prometheus that the canary operator reads, on a fixed port so it can die and come back there
    (the operator keeps its URL). Its TSDB stays on disk across a restart."""

    binary: str
    data: Path
    port: int
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60) -> None:
        with (self.data / "prometheus.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.data / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.data / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}; see {self.data / 'prometheus.log'}")
            return get_ok(self.url + "/-/ready")

        wait_until("prometheus ready", ready, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, as a crashed or evicted Prometheus: its port refuses connections at once."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None

    def ensure_running(self) -> None:
        """Back up (after a scenario killed it) for whoever reads it next."""
        if not self.running:
            self.start()


def feature_events(kube: Kube, namespace: str, name: str) -> list[client.CoreV1Event]:
    """The Events posted on the AIFeature `name`, oldest first."""
    events = kube.core.list_namespaced_event(namespace).items
    return [e for e in events if e.involved_object.kind == "AIFeature" and e.involved_object.name == name]


def counter_value(metrics_text: str, name: str, **labels: str) -> float:
    """The sum of the samples of counter `name` (with its _total) whose labels include `labels`; 0 if none."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
