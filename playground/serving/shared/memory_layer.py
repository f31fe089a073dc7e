"""The embedded mode's channel layer: Channels' in-memory layer without its per-message sweep.

Channels' `InMemoryChannelLayer` walks every channel's queue and every group's members for expired entries
on each `send`, `receive` and `group_send`, and `group_send` starts a task per member. On the embedded stack
every token message goes through it, so with 64 chats streaming each step's 64 messages paid for 64 walks
over 64 channels and 64 groups: the largest piece of the event loop's own work in a `python -m bench.serving`
profile. Here the sweep runs at most once per `SWEEP_EVERY_S` (messages expire after `expiry`, 60 s, and
group memberships after a day, so a second's lateness changes nothing a user sees), and a group message is
put on each member's queue directly (`send` never waits: a full queue raises at once).
"""
from __future__ import annotations

import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

SWEEP_EVERY_S = 1.0


class EmbeddedChannelLayer(InMemoryChannelLayer):
    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self._next_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY_S
            super()._clean_expired()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """As Channels' (a member whose queue is full misses the message), without a task per member."""
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, {})):
            try:
                await self.send(channel, message)
            except ChannelFull:
                pass
