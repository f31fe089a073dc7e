"""DemoConsumer: the /ws/demo/ socket of the presenter page (protocol in docs/api.md, "Demo mode").

Everyone on the page watches the same run: the consumer joins group `demo` (events from the runner) and
sends the worker snapshots from the registry a few times a second for the memory charts. Starting and
stopping a run is for presenters: staff, or anyone while anonymous chat is allowed (the embedded default).
"""
import asyncio
import math
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from playground.chat.protocol import decode_frame
from playground.serving import registry
from playground.serving.params import InvalidInput

from .runner import GROUP, RunSettings, runner

SNAPSHOT_INTERVAL_S = 0.5
CLOSE_LOGIN_REQUIRED = 4401
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
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise InvalidInput(f"rate must be a number of arrivals per second in (0, {MAX_RATE}]")
    cap = settings.PLAYGROUND_LIMITS["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= cap:
        raise InvalidInput(f"max_tokens must be an integer between 1 and {cap}")
    if not isinstance(cache_salt, bool):
        raise InvalidInput("cache_salt must be true or false")
    return RunSettings(users=users, rate=float(rate), max_tokens=max_tokens, cache_salt=cache_salt)


def may_watch(user) -> bool:
    return settings.PLAYGROUND_ALLOW_ANONYMOUS or bool(user and user.is_authenticated)


def may_present(user) -> bool:
    return settings.PLAYGROUND_ALLOW_ANONYMOUS or bool(user and user.is_staff)


class DemoConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.snapshots: asyncio.Task | None = None
        if not may_watch(self.scope.get("user")):
            await self.close(code=CLOSE_LOGIN_REQUIRED)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"type": "state", **runner.state()})
        self.snapshots = asyncio.create_task(self.send_snapshots())

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(GROUP, self.channel_name)
        if getattr(self, "snapshots", None) is not None:
            self.snapshots.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = decode_frame(text_data, settings.PLAYGROUND_LIMITS["max_frame_bytes"])
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

    async def send_snapshots(self) -> None:
        """Worker figures for the charts, from the heartbeats (the shape of common/snapshot.js)."""
        last_time: dict[str, float] = {}
        while True:
            for worker in await registry.alive_workers():
                if worker.get("metrics") and worker["time"] != last_time.get(worker["name"]):
                    last_time[worker["name"]] = worker["time"]
                    await self.send_json({"type": "snapshot", "worker": worker["name"], "time": worker["time"],
                                          "metrics": worker["metrics"]})  # fmt: skip
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
