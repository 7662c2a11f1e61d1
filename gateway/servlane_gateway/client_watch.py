"""Stop the work of a request whose client has gone: its upstream connection closes, so the backend stops too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive, Scope

from servlane_gateway.http_server import DISCONNECT_EXTENSION, OnDisconnect

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while the gateway waited for the backend."""


class _Watch:
    __slots__ = ("left", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.left = False

    def client_left(self) -> None:
        if not self.left:
            self.left = True
            self.task.cancel()


async def _cancel_when_gone(receive: Receive, watch: _Watch) -> None:
    # Called once the body has been read, so the next message is http.disconnect, whenever it comes.
    while (await receive())["type"] != "http.disconnect":
        pass
    watch.client_left()


async def unless_client_leaves(scope: Scope, receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; when the client disconnects first, cancel it and raise ClientGone.

    The work runs in the caller's task, which the disconnect cancels: under the gateway's own server protocol
    through its disconnect callback (servlane_gateway.http_server), under any other through a watcher task
    waiting for `http.disconnect`. (It used to race the work as a task of its own with asyncio.wait: a task,
    a wait and a gather more per request.) The cancellation is told from others (a server shutting down) by
    the watch's mark and Task.uncancel(), so those still propagate."""
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(task)
    on_disconnect: OnDisconnect | None = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
    watcher = None
    if on_disconnect is not None:
        on_disconnect(watch.client_left)
    else:
        watcher = asyncio.ensure_future(_cancel_when_gone(receive, watch))
    try:
        result = await work
    except asyncio.CancelledError:
        if not watch.left or task.uncancel() > 0:
            raise
        raise ClientGone from None
    finally:
        if on_disconnect is not None:
            on_disconnect(None)
        if watcher is not None:
            watcher.cancel()  # a watcher already woken by the disconnect is cancelled before it runs again
    if watch.left:  # the work swallowed the cancellation: nobody reads its result anyway
        task.uncancel()
        raise ClientGone
    return result
