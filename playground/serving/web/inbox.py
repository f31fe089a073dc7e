"""Where a web process hears the workers: one channel-layer channel per process (per event loop), read by one
task that hands each event to its request's `Collector` by request id.

Why one channel for all requests, not one per request: a worker's token publisher sends, per engine step, one
`gen.batch` message per web process carrying every one of its requests' new text, where it used to send one
message per request. Through Redis every message costs the worker a group lookup and a send, and the web
process a pop, and each wakes both processes and Redis, taking a core from the engine's threads for a moment.
With 32 streams that was 32 messages a step; on the distributed stack one message per web process raised the
output 1.08-1.27x and cut the web process's CPU to a quarter (BENCHMARKS.md, "Serving path"). A request's
events all come through this one channel, so they arrive in the order the worker sent them: `gen.accepted`, its
text, then `gen.done` or `gen.error`.

The channel's name travels in the request's `Job.reply_to`. The receiving task runs while a request is
registered; an event for a request no longer registered (it ended on this side first) is dropped. If the
channel layer fails, every registered request fails with it (a `gen.error` "unavailable" put to its
collector, as if its worker had sent it), as when each request had its own receiver; the next request starts
receiving again.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from ..shared.naming import BATCH, WEB_CHANNEL_PREFIX
from ..shared.retry import once_more

if TYPE_CHECKING:
    from .lifecycle import Collector

logger = logging.getLogger(__name__)


def events_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The worker events a channel message carries: a batch's, or the message itself."""
    return message["events"] if message.get("type") == BATCH else [message]


class Inbox:
    """One event loop's channel and the requests listening on it (touched on that loop only)."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel = ""
        self._collectors: dict[str, Collector] = {}
        self._receiver: asyncio.Task | None = None

    async def open(self, request_id: str, collector: Collector) -> str:
        """Route `request_id`'s events to `collector` from now on; returns the channel the worker sends to."""
        if not self.channel:
            self.channel = await self.layer.new_channel(WEB_CHANNEL_PREFIX)
        self._collectors[request_id] = collector
        if self._receiver is None or self._receiver.done():
            self._receiver = asyncio.ensure_future(self._receive())
        return self.channel

    def close(self, request_id: str) -> None:
        """Stop routing `request_id`'s events; the receiving task stops with the last request."""
        self._collectors.pop(request_id, None)
        if not self._collectors and self._receiver is not None:
            self._receiver.cancel()
            self._receiver = None

    async def _receive(self) -> None:
        try:
            while self._collectors:
                for event in events_of(await once_more(lambda: self.layer.receive(self.channel))):
                    collector = self._collectors.get(event.get("request_id"))
                    if collector is not None:
                        collector.put(event)
        except Exception:  # a cancellation passes: CancelledError is no Exception
            logger.exception("lost the channel layer while serving %d request(s)", len(self._collectors))
            for request_id, collector in self._collectors.items():  # as if each request's worker had said so
                collector.put({"type": "gen.error", "request_id": request_id, "code": "unavailable",
                               "message": "the server lost its channel layer (Redis) mid-reply"})


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Inbox] = weakref.WeakKeyDictionary()


def current() -> Inbox:
    """The running event loop's inbox on the default channel layer (a new one if the layer was replaced)."""
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    inbox = _inboxes.get(loop)
    if inbox is None or inbox.layer is not layer:
        inbox = _inboxes[loop] = Inbox(layer)
    return inbox
