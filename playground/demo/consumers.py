"""DemoConsumer: the /ws/demo/ socket of the presenter page (protocol in docs/api.md, "Demo mode").

Everyone on the page watches the same run: the consumer joins group `demo` (events from the runner) and
the dashboard's summary feed (group `kv.summary`: each worker's figures a few times a second while it is
busy, nothing that names a request) for the memory charts. Starting and stopping a run is for presenters:
staff, or anyone while anonymous chat is allowed (the embedded default).
"""
import asyncio
import math
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from playground.accounts.access import may_present, may_use_playground
from playground.dashboard.subscription import Subscription
from playground.serving.shared import kv_feed
from playground.serving.web.edge import CLOSE_CODES, InvalidInput, decode_frame

from .blockview import demo_blocks
from .runner import GROUP, RunSettings, runner

CLOSE_LOGIN_REQUIRED = CLOSE_CODES["login_required"]
MAX_RATE = 50.0


def parse_start(frame: dict[str, Any]) -> RunSettings:
    unknown = sorted(set(frame) - {"type", "users", "rate", "max_tokens", "cache_salt"})
    if unknown:
        raise InvalidInput(f"unknown field(s) in start: {', '.join(unknown)}")
    users, rate = frame.get("users"), frame.get("rate", 2.0)
    max_tokens, cache_salt = frame.get("max_tokens", 64), frame.get("cache_salt", False)
    max_users = settings.PLAYGROUND_DEMO_MAX_USERS
    if isinstance(users, bool) or not isinstance(users, int) or not 1 <= users <= max_users:
        raise InvalidInput(f"users must be an integer between 1 and {max_users}")
    numeric = isinstance(rate, (int, float)) and not isinstance(rate, bool)
    if not (numeric and math.isfinite(rate) and 0 < rate <= MAX_RATE):
        raise InvalidInput(f"rate must be a number of arrivals per second in (0, {MAX_RATE}]")
    cap = settings.PLAYGROUND_LIMITS["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= cap:
        raise InvalidInput(f"max_tokens must be an integer between 1 and {cap}")
    if not isinstance(cache_salt, bool):
        raise InvalidInput("cache_salt must be true or false")
    return RunSettings(users=users, rate=float(rate), max_tokens=max_tokens, cache_salt=cache_salt)


class DemoConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = None  # the Subscription owns the channel (playground/dashboard/subscription.py)

    async def connect(self) -> None:
        self.subscription: Subscription | None = None
        self.renewals: asyncio.Task | None = None
        if not may_use_playground(self.scope.get("user")):
            await self.close(code=CLOSE_LOGIN_REQUIRED)
            return
        # Full snapshots too, for the block map of the demo's own requests (demo_blocks filters them).
        self.subscription = Subscription((GROUP, kv_feed.SUMMARY_GROUP, kv_feed.KV_GROUP), self,
                                         on_relay=self.relaying)
        await self.subscription.start()
        await self.accept()
        self.subscription.relay()
        self.renewals = asyncio.create_task(kv_feed.keep_watching(get_channel_layer()))

    async def relaying(self, layer) -> None:
        """In the groups (again): the run's state as of now (the events queued since follow it), and fresh
        snapshots."""
        await self.send_json({"type": "state", **runner.state()})
        await kv_feed.ask_for_snapshots(layer, full=True)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "renewals", None) is not None:
            self.renewals.cancel()
        if getattr(self, "subscription", None) is not None:
            await self.subscription.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = decode_frame(text_data, settings.PLAYGROUND_LIMITS)
            kind = frame.get("type")
            if kind not in ("start", "stop"):
                raise InvalidInput("type must be 'start' or 'stop'")
            if not may_present(self.scope.get("user")):
                raise InvalidInput("only staff may start or stop the demo")
            if kind == "start":
                await runner.start(parse_start(frame))
            else:
                await runner.stop()
        except InvalidInput as exc:
            await self.send_json({"type": "error", "message": str(exc)})

    async def demo_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "event", **message["event"]})

    async def kv_recording(self, message: dict[str, Any]) -> None:
        """Staff recordings of a worker (on the same group) are not the demo's business."""

    async def kv_snapshot(self, event: dict[str, Any]) -> None:
        """A worker's summary snapshot (shape: serving/worker/kv_snapshot.py) for the charts; a full one
        becomes the block map of the demo's own requests, nothing of anyone else's."""
        snapshot = event["snapshot"]
        if "block_map" in snapshot:
            await self.send_json(demo_blocks(snapshot, runner.request_names()))
        else:
            await self.send_json(snapshot)
