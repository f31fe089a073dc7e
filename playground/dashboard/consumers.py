"""The dashboard's websockets: worker snapshots for the admin memory view and for the chat page's KV panel.

`/ws/kv/` (KvSummaryConsumer, whoever may chat) relays snapshot summaries: figures only, nothing that names
a request. `/ws/memory/` (MemoryConsumer, staff only) relays every worker's full snapshots (group `kv`, see
feed.py) and carries the page's actions back to the workers: `{"type": "abort", "worker", "request_id"}`
goes out as the serving control group's ordinary abort (the worker running the request aborts it; the chat
socket that started it gets its `done` with finish_reason "abort"), `{"type": "reset_prefix_cache",
"worker"}` goes to that worker only. Each action is answered with `{"type": "ack", "message"}` or
`{"type": "error", "message"}`.
"""
import asyncio
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from playground.serving.shared import registry
from playground.serving.web import dispatch
from playground.serving.web.edge import CLOSE_CODES, InvalidInput, decode_frame

from . import feed
from .views import is_staff

logger = logging.getLogger(__name__)

CLOSE_LOGIN_REQUIRED = CLOSE_CODES["login_required"]
CLOSE_FORBIDDEN = CLOSE_CODES["forbidden"]


class InvalidAction(InvalidInput):
    """A frame the memory view should never send; reported back as an error frame."""


def _text_field(frame: dict[str, Any], name: str) -> str:
    value = frame.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidAction(f"{name} must be a non-empty string")
    return value


class SnapshotFeed(AsyncJsonWebsocketConsumer):
    """Relays the snapshots of `group` to users `allowed` to see them; others are closed with `refusal`."""

    group: str
    refusal: int
    full = False  # full snapshots (a watch lease) rather than summaries

    def allowed(self, user: Any) -> bool:
        """Who may watch; each feed says. The base lets no one in (fail closed)."""
        return False

    async def connect(self) -> None:
        if not self.allowed(self.scope.get("user")):
            await self.close(code=self.refusal)
            return
        await self.accept()
        await feed.watch(self.channel_layer, self.channel_name, self.group, self.full)

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def kv_snapshot(self, event: dict[str, Any]) -> None:
        await self.send_json(event["snapshot"])


class KvSummaryConsumer(SnapshotFeed):
    group = feed.SUMMARY_GROUP
    refusal = CLOSE_LOGIN_REQUIRED

    def allowed(self, user: Any) -> bool:
        """The chat page's rule (playground.chat.consumers)."""
        return settings.PLAYGROUND_ALLOW_ANONYMOUS or bool(user and user.is_authenticated)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send_json({"type": "error", "message": "this feed is read-only"})


class MemoryConsumer(SnapshotFeed):
    group = feed.KV_GROUP
    refusal = CLOSE_FORBIDDEN
    full = True

    def allowed(self, user: Any) -> bool:
        return is_staff(user)

    async def connect(self) -> None:
        self.renewals: asyncio.Task | None = None
        await super().connect()
        if self.allowed(self.scope.get("user")):
            self.renewals = asyncio.create_task(self.renew_lease())

    async def disconnect(self, code: int) -> None:
        if getattr(self, "renewals", None) is not None:
            self.renewals.cancel()
        await super().disconnect(code)

    async def renew_lease(self) -> None:
        """Keep the workers building full snapshots while this view is open."""
        while True:
            await asyncio.sleep(feed.WATCH_RENEW_S)
            try:
                await feed.renew(self.channel_layer)
            except Exception:  # the layer is down: try again next round; the lease outlives two misses
                logger.exception("could not renew the memory view's watch lease")

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = await self.act(decode_frame(text_data, settings.PLAYGROUND_LIMITS))
        except InvalidInput as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            return
        await self.send_json({"type": "ack", "message": message})

    async def act(self, frame: dict[str, Any]) -> str:
        """Carry out one action; returns the confirmation to show."""
        kind = frame.get("type")
        worker = _text_field(frame, "worker")
        if kind == "abort":
            request_id = _text_field(frame, "request_id")
            await dispatch.abort(request_id)
            return f"Abort sent for request {request_id}."
        if kind == "reset_prefix_cache":
            if await registry.aget(worker) is None:
                raise InvalidAction(f"worker {worker} is not alive")
            await feed.reset_prefix_cache(self.channel_layer, worker)
            return f"Prefix cache of {worker} reset."
        raise InvalidAction("type must be 'abort' or 'reset_prefix_cache'")
