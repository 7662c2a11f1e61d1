"""Periodic work without kopf timers, so that no AIModel or AIFeature ever carries a finalizer.

kopf puts its finalizer on every object that a @kopf.timer or @kopf.daemon serves (it must stop the
object's timer task before the object goes) and will not do otherwise (nolar/kopf#896, #1001). Then
deleting an AIModel or AIFeature waits for the operator: forever when it is not running (uninstalled
first, crashed, scaled to zero). Our periodic work needs no task per object: one loop per kind walks
kopf's index of the objects, which holds the latest copy kopf saw and drops an object when it is
deleted, so nothing has to be stopped when an object goes and nothing has to hold it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn

log = logging.getLogger(__name__)


async def every(
    seconds: float, work: Callable[[], Awaitable[None]], may_act: Callable[[], Awaitable[bool]], what: str
) -> NoReturn:
    """Runs `work` every `seconds` while `may_act` allows (kopf peering); a failed round is logged and the
    next one tries again, as a failed kopf timer run would be."""
    while True:
        await asyncio.sleep(seconds)
        try:
            if await may_act():
                await work()
        except Exception:
            log.exception("periodic %s failed; retrying in %ss", what, seconds)


async def each(what: str, jobs: Iterable[tuple[str, Awaitable[None]]]) -> None:
    """Runs one round's jobs at once; one object's failure is logged and does not stop the others."""
    named = list(jobs)
    results = await asyncio.gather(*(job for _, job in named), return_exceptions=True)
    for (name, _), result in zip(named, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.warning("periodic %s of %s failed: %s", what, name, result)
