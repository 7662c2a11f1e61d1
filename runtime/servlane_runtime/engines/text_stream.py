"""Incremental detokenisation with stop strings, for engines that generate token by token.

Why hold text back: a byte-level tokenizer may split one character over two tokens (the decoded
text then ends in U+FFFD), and a stop string may be split over several tokens; in both cases the
text is released only once it is certain.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StreamStep:
    text: str
    stopped: bool


class StopTextStream:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._emitted = 0

    def step(self, text: str, *, final: bool = False) -> StreamStep:
        """`text` is all generated text so far; return what may be sent now."""
        cut = self._earliest_stop(text)
        if cut is not None:
            return StreamStep(self._release(text[:cut]), stopped=True)
        if final:
            return StreamStep(self._release(text.rstrip("\ufffd")), stopped=False)
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        safe -= self._partial_stop_suffix(text[:safe])
        return StreamStep(self._release(text[:safe]), stopped=False)

    def _release(self, upto_text: str) -> str:
        if len(upto_text) <= self._emitted:
            return ""
        out = upto_text[self._emitted :]
        self._emitted = len(upto_text)
        return out

    def _earliest_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s, max(0, self._emitted - len(s))) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that could still grow into a stop string."""
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
