"""Work that a burst of requests does together (runs on a web process's event loop): `Batcher` hands a blocking
call everything queued while its last run was busy.

A burst of chats started at once (64 in `python -m bench.serving`) sent each of their Celery tasks and each of
their replies' writes through a thread call of its own: 64 wake-ups of the event loop and of a thread, and 64
runs of the same setup (a Redis client and a round trip per task; a transaction per reply), all on the cores the
engine computes on. Here the first item goes at once and every item that arrives while that call runs goes in
the next one: no item waits for a timer, and a burst costs a few calls.
"""
from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Runs `call(items)` (awaitable, one result per item in order) for the items queued, batch after batch, in
    arrival order. Touched on one event loop."""

    def __init__(self, call: Callable[[list[Item]], Awaitable[list[Result]]]) -> None:
        self._call = call
        self._queued: list[tuple[Item, asyncio.Future[Result]]] = []
        self._running: asyncio.Task | None = None

    async def submit(self, item: Item) -> Result:
        """`item`'s result once its batch ran; raises what the call raised for that batch. A caller cancelled
        meanwhile does not unqueue its item (it may be in a call already)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queued.append((item, future))
        if self._running is None:
            # In a context of its own: the batch serves many requests, so it runs under none of their log ids.
            self._running = loop.create_task(self._run(), context=contextvars.Context())
        return await future

    async def _run(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    results = await self._call([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running = None
            for _, future in batch + self._queued:  # only when cancelled (the loop closing): nobody waits forever
                future.cancel()
            self._queued = []


def per_loop(make: Callable[[], Batcher[Item, Result]]) -> Callable[[], Batcher[Item, Result]]:
    """A function returning the running event loop's own Batcher, made by `make` on first use (a process may
    run several loops: daphne's, and tests' own)."""
    batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = weakref.WeakKeyDictionary()

    def current() -> Batcher[Item, Result]:
        loop = asyncio.get_running_loop()
        batcher = batchers.get(loop)
        if batcher is None:
            batcher = batchers[loop] = make()
        return batcher

    return current
