"""The chat sockets' reply writer (runs on the web process's event loop): replies that end together are
stored together.

A burst of chats started at once ends in one engine step, and each socket saving its reply in a transaction of
its own queued them on the one database thread: with 64 chats the last `done` frame left ~0.2 s after the
engine's last token (`python -m bench.serving`). Here the first reply is written at once and every reply that
arrives while a write runs goes in the next one (`store.save_replies`): no reply waits for a timer, and a
burst costs a few transactions.
"""
from __future__ import annotations

import asyncio
import weakref

from channels.db import database_sync_to_async

from . import store
from .models import Message


class ReplyWriter:
    """One per event loop (`save`); its replies are written in arrival order, batch after batch."""

    def __init__(self) -> None:
        self._queued: list[tuple[store.Reply, asyncio.Future]] = []
        self._writing: asyncio.Task | None = None

    async def save(self, reply: store.Reply) -> Message | None:
        """Store `reply` with those queued beside it: its message, or None when its conversation is gone.
        Raises what the database raised for its batch. A caller cancelled meanwhile does not unqueue it."""
        future = asyncio.get_running_loop().create_future()
        self._queued.append((reply, future))
        if self._writing is None:
            self._writing = asyncio.ensure_future(self._write())
        return await future

    async def _write(self) -> None:
        batch: list[tuple[store.Reply, asyncio.Future]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    saved = await database_sync_to_async(store.save_replies)([reply for reply, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), message in zip(batch, saved):
                    if not future.done():
                        future.set_result(message)
        finally:
            self._writing = None
            for _, future in batch + self._queued:  # only when cancelled (the loop closing): nobody waits forever
                future.cancel()
            self._queued = []


_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyWriter] = weakref.WeakKeyDictionary()


async def save(reply: store.Reply) -> Message | None:
    """`ReplyWriter.save` on the running loop's writer."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = ReplyWriter()
    return await writer.save(reply)
