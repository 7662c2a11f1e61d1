"""Client traffic for e2e tests: background threads sending small chat requests with the official `openai` client
and recording who answered (the response's `model`) or how it failed, with timestamps."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import openai


@dataclass
class Outcome:
    started: float
    ended: float
    model: str | None  # the runtime that answered, from the response
    error: str | None  # the HTTP status, or the client's exception name when there was no response


@dataclass
class Load:
    """Background threads sending `model: <feature>` chat requests to an OpenAI base URL (ending in /v1)."""

    base_url: str
    feature: str = "chat"
    threads: int = 2
    timeout: float = 20
    api_key: str = "unused"  # a gateway with a keys file needs a real one
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=self.timeout + 10)

    def _run(self) -> None:
        http = openai.DefaultHttpxClient(trust_env=False)  # cluster addresses: never through a proxy
        client = openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout, http_client=http
        )
        while not self._stop.is_set():
            started, model, error = time.monotonic(), None, None
            try:
                reply = client.chat.completions.create(
                    model=self.feature, messages=[{"role": "user", "content": "Hello!"}], max_tokens=3
                )
                model = reply.model
            except openai.APIStatusError as exc:
                error = str(exc.status_code)
            except openai.APIError as exc:
                error = type(exc).__name__
            with self._lock:
                self.outcomes.append(Outcome(started, time.monotonic(), model, error))
            self._stop.wait(0.02)  # pacing between requests, not synchronisation
        client.close()

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def answered_since(self, moment: float) -> list[Outcome]:
        return [o for o in self.snapshot() if o.started >= moment]

    def only_answered_by(self, model: str, since: float, count: int = 10) -> bool:
        """The last `count` requests started after `since` were all answered by `model`."""
        recent = self.answered_since(since)
        return len(recent) >= count and all(o.model == model and o.error is None for o in recent[-count:])
