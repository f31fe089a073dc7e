"""A socket's channel-layer subscription that outlives the layer failing (web side).

A Channels consumer with a channel of its own dies with 1011 when the layer's `receive` raises (Redis
restarting), and the page learns nothing. The feeds (/ws/kv/, /ws/memory/, /ws/demo/) therefore set
`channel_layer_alias = None` and hold a `Subscription` instead: a task that owns a channel, joins the
groups, and hands every message to the consumer's handler for its type (`kv.snapshot` -> `kv_snapshot`,
Channels' naming; none of these handlers touch the database, so Channels' per-message hop to the sync
thread to close stale database connections is skipped — it held snapshots back while a chat used that thread).
A consumer joins before it accepts the socket and opens the relay after, so nothing sent to the groups
after `connect` is lost and nothing is sent before the accept. When the layer fails the page gets one
LOST_FRAME and the socket stays open; the task retries every RETRY_S, and once it is back it joins again,
runs `on_relay` again (the workers are asked for fresh snapshots) and sends BACK_FRAME.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer
from channels.consumer import get_handler_name

from playground.serving.shared.naming import WEB_CHANNEL_PREFIX

logger = logging.getLogger(__name__)

RETRY_S = 1.0
LOST_FRAME = {"type": "error", "message": "live updates paused: the channel layer is unavailable (retrying)"}
BACK_FRAME = {"type": "ack", "message": "live updates resumed"}


class Subscription:
    def __init__(self, groups: tuple[str, ...], consumer: Any,
                 on_relay: Callable[[Any], Awaitable[None]] | None = None) -> None:
        """Relay `groups` to `consumer`'s handlers; its `send_json` tells the page about a lost or regained
        layer; `on_relay(layer)` runs each time relaying (re)starts, before the first message is relayed."""
        self.groups = groups
        self._consumer = consumer
        self._on_relay = on_relay
        self._layer = get_channel_layer()
        self._channel: str | None = None
        self._task: asyncio.Task | None = None
        self._tried = asyncio.Event()  # the first join has succeeded or failed
        self._open = asyncio.Event()  # the socket is accepted: frames may go out

    async def start(self) -> None:
        """Join the groups (call it before accepting the socket); returns once the first try is done, whether
        it succeeded (messages sent from now on wait in the channel) or failed (it keeps retrying)."""
        self._task = asyncio.create_task(self._run())
        await self._tried.wait()

    def relay(self) -> None:
        """The socket is accepted: relay what arrives (and say so if the layer is down)."""
        self._open.set()

    async def close(self) -> None:
        """Stop relaying and leave the groups (best effort: a layer that is down forgets them by expiry)."""
        if self._task is not None:
            self._task.cancel()
        if self._channel is not None:
            for group in self.groups:
                try:
                    await self._layer.group_discard(group, self._channel)
                except Exception:
                    logger.debug("could not leave %s", group, exc_info=True)

    async def _run(self) -> None:
        lost = False
        while True:
            try:
                self._channel = await self._layer.new_channel(WEB_CHANNEL_PREFIX)
                for group in self.groups:
                    await self._layer.group_add(group, self._channel)
                self._tried.set()
                await self._open.wait()
                if self._on_relay is not None:
                    await self._on_relay(self._layer)
                if lost:
                    await self._consumer.send_json(BACK_FRAME)
                    lost = False
                while True:
                    message = await self._layer.receive(self._channel)
                    try:
                        await getattr(self._consumer, get_handler_name(message))(message)
                    except Exception:  # a handler's bug is not the layer's failure: keep relaying
                        logger.exception("feed handler failed on %s", message.get("type"))
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("feed subscription to %s lost; retrying", self.groups, exc_info=True)
                self._tried.set()
                await self._open.wait()
                if not lost:
                    lost = True
                    await self._consumer.send_json(LOST_FRAME)
                await asyncio.sleep(RETRY_S)
