"""Stop the work of a request whose client has gone, in the runtime and the gateway alike.

The work is cancelled as soon as the client disconnects (event-driven, as vLLM's `with_cancellation` races a
handler against `receive()`): in the gateway its upstream connection closes, so the backend stops too; in the
runtime the engine aborts the generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.types import Receive, Scope

T = TypeVar("T")

# A server may offer scope["extensions"][DISCONNECT_EXTENSION](callback): `callback` is called once when the
# client's connection is lost (at once if it is lost already); `None` unregisters it. One per connection: the
# request being served. The gateway's own server protocol does (servlane_web.http_server).
DISCONNECT_EXTENSION = "servlane.on_disconnect"
OnDisconnect = Callable[[Callable[[], None] | None], None]


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

    The work runs in the caller's task, which the disconnect cancels: under a server that offers the disconnect
    callback (the gateway's own, servlane_web.http_server) through it, under any other through a watcher task
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
