"""One LoRA adapter at a time on the transformers engine's shared model: steps with the active adapter run
together, a step for another waits until they end (and meanwhile no new step of the active one starts), and
loading or unloading an adapter runs alone. Taken per token, so no request waits for a whole generation of
another adapter."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator

_EXCLUSIVE = object()  # the switch's mark while the model itself changes (an adapter loads or unloads)
_UNSET = object()  # after such a change: the next step sets its adapter again, whatever it was before


class AdapterSwitch:
    """One adapter at a time on the shared model. Steps with the active adapter run together; a step for
    another waits until they end, and while it waits no new step of the active one starts (no starvation)."""

    def __init__(self, activate: Callable[[str | None], None]) -> None:
        self._activate = activate
        self._cond = threading.Condition()
        self._active: object = None
        self._running = 0
        self._waiting: Counter[object] = Counter()

    def _others_waiting(self) -> bool:
        return any(count for name, count in self._waiting.items() if name != self._active)

    @contextlib.contextmanager
    def step(self, name: object) -> Iterator[None]:
        """`name`: the adapter (None: the base model), or _EXCLUSIVE."""
        with self._cond:
            self._waiting[name] += 1
            while self._running and (self._active != name or self._others_waiting()):
                self._cond.wait()
            self._waiting[name] -= 1
            if self._active != name:
                if name is None or isinstance(name, str):
                    self._activate(name)
                self._active = name
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """No step runs meanwhile (the model object may be replaced)."""
        with self.step(_EXCLUSIVE):
            yield
        with self._cond:
            self._active = _UNSET
