"""The dashboard's websockets: worker snapshots for the admin memory view and for the chat page's KV panel.

`/ws/kv/` (KvSummaryConsumer, whoever may chat) relays snapshot summaries: figures only, nothing that names
a request. `/ws/memory/` (MemoryConsumer, staff only) relays every worker's full snapshots (group `kv`, see
kv_feed.py) and carries the page's actions back to the workers: `{"type": "abort", "worker", "request_id"}`
goes out as the serving control group's ordinary abort (the worker running the request aborts it; the chat
socket that started it gets its `done` with finish_reason "abort"), `{"type": "reset_prefix_cache",
"worker"}` goes to that worker only. Each action is answered with `{"type": "ack", "message"}` or
`{"type": "error", "message"}`.
"""
import asyncio
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from playground.accounts.access import is_staff, may_use_playground
from playground.serving.shared import kv_feed, registry
from playground.serving.web import dispatch
from playground.serving.web.edge import CLOSE_CODES, InvalidInput, decode_frame

from .subscription import Subscription

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

    channel_layer_alias = None  # the Subscription owns the channel, so a failing layer is a frame, not 1011
    group: str
    refusal: int
    full = False  # full snapshots (a watch lease) rather than summaries

    def allowed(self, user: Any) -> bool:
        """Who may watch; each feed says. The base lets no one in (fail closed)."""
        return False

    async def connect(self) -> None:
        self.subscription: Subscription | None = None
        if not self.allowed(self.scope.get("user")):
            await self.close(code=self.refusal)
            return
        self.subscription = Subscription((self.group,), self,
                                         on_relay=lambda layer: kv_feed.ask_for_snapshots(layer, self.full))
        await self.subscription.start()
        await self.accept()
        self.subscription.relay()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "subscription", None) is not None:
            await self.subscription.close()

    async def kv_snapshot(self, event: dict[str, Any]) -> None:
        await self.send_json(event["snapshot"])


class KvSummaryConsumer(SnapshotFeed):
    group = kv_feed.SUMMARY_GROUP
    refusal = CLOSE_LOGIN_REQUIRED

    def allowed(self, user: Any) -> bool:
        return may_use_playground(user)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send_json({"type": "error", "message": "this feed is read-only"})


class MemoryConsumer(SnapshotFeed):
    group = kv_feed.KV_GROUP
    refusal = CLOSE_FORBIDDEN
    full = True

    def allowed(self, user: Any) -> bool:
        return is_staff(user)

    async def connect(self) -> None:
        self.renewals: asyncio.Task | None = None
        await super().connect()
        if self.allowed(self.scope.get("user")):
            self.renewals = asyncio.create_task(kv_feed.keep_watching(get_channel_layer()))

    async def disconnect(self, code: int) -> None:
        if getattr(self, "renewals", None) is not None:
            self.renewals.cancel()
        await super().disconnect(code)

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
            await kv_feed.reset_prefix_cache(get_channel_layer(), worker)
            return f"Prefix cache of {worker} reset."
        if kind == "record":
            action = frame.get("action")
            if action not in ("start", "stop"):
                raise InvalidAction("action must be 'start' or 'stop'")
            if await registry.aget(worker) is None:
                raise InvalidAction(f"worker {worker} is not alive")
            await kv_feed.record(get_channel_layer(), worker, action)
            return f"Recording of {worker}: {action} sent."
        raise InvalidAction("type must be 'abort', 'reset_prefix_cache' or 'record'")

    async def kv_recording(self, message: dict[str, Any]) -> None:
        """A worker's recording started, stopped (ready to download) or failed."""
        await self.send_json({**message, "type": "recording"})
