"""The demo run: N simulated users arriving at a chosen rate, each chatting through the same Celery ->
engine path and request lifecycle as real visitors (`serving.web.lifecycle`), so they share the worker's batch with them.

One run at a time per web process. Everything a watcher needs goes to the channel-layer group `demo` as
`demo.event` messages (see `DemoConsumer`), and `state()` gives late joiners the picture so far.
"""
import asyncio
import logging
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from playground.serving.web import lifecycle, sampling
from playground.serving.web.lifecycle import GenerationFailed, Job

from .presets import preset

logger = logging.getLogger(__name__)

GROUP = "demo"


@dataclass
class SimUser:
    user: int
    name: str
    prompt: str  # the last user message, for display
    state: str = "waiting"  # waiting -> streaming -> done | error | stopped
    text: str = ""
    usage: dict[str, int] | None = None
    timing: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    request_id: str | None = None  # the engine's id of this user's request, once submitted


@dataclass(frozen=True)
class RunSettings:
    users: int
    rate: float  # arrivals per second (Poisson)
    max_tokens: int
    cache_salt: bool  # give every simulated user their own prefix-cache salt


@dataclass
class Run:
    settings: RunSettings
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    started_at: float = field(default_factory=time.time)
    users: list[SimUser] = field(default_factory=list)
    state: str = "running"  # running -> finished | stopped


class DemoRunner:
    def __init__(self) -> None:
        self.run: Run | None = None
        self._tasks: set[asyncio.Task] = set()

    def state(self) -> dict[str, Any]:
        if self.run is None:
            return {"run": None, "users": []}
        return {"run": self._run_info(), "users": [asdict(u) for u in self.run.users]}

    def _run_info(self) -> dict[str, Any]:
        run = self.run
        return {"run_id": run.run_id, "state": run.state, "started_at": run.started_at, **asdict(run.settings)}

    @property
    def running(self) -> bool:
        return self.run is not None and self.run.state == "running"

    async def start(self, run_settings: RunSettings) -> None:
        """Start a run (stopping any previous one)."""
        await self.stop()
        self.run = Run(run_settings)
        await self._broadcast({"kind": "run", **self.state()})
        self._spawn(self._arrivals(self.run))

    async def stop(self) -> None:
        """Abort every simulated user's request (their blocks are freed) and end the run."""
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.run is not None and self.run.state == "running":
            self.run.state = "stopped"
            for user in self.run.users:
                if user.state in ("waiting", "streaming"):
                    user.state = "stopped"
            await self._broadcast({"kind": "run", **self.state()})

    def _spawn(self, coro) -> asyncio.Task:
        """Run `coro` as part of the run, so that stop() cancels it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _arrivals(self, run: Run) -> None:
        arrivals = random.Random(run.run_id)
        users = []
        for i in range(run.settings.users):
            if i:
                await asyncio.sleep(arrivals.expovariate(run.settings.rate))
            chosen = preset(i)
            user = SimUser(i, chosen["name"], chosen["messages"][-1]["content"])
            run.users.append(user)
            await self._broadcast({"kind": "user", "user": asdict(user)})
            users.append(self._spawn(self._chat(run, user, chosen["messages"])))
        await asyncio.gather(*users, return_exceptions=True)
        if run.state == "running":
            run.state = "finished"
            await self._broadcast({"kind": "run", **self.state()})

    async def _chat(self, run: Run, user: SimUser, messages: list[dict[str, str]]) -> None:
        params = {**sampling.defaults(settings.PLAYGROUND_LIMITS), "max_tokens": run.settings.max_tokens,
                  "seed": user.user}
        salt = f"demo:{run.run_id}:{user.user}" if run.settings.cache_salt else None
        try:
            async with await lifecycle.admit() as generation:  # the presenter's simulated users: no limits
                user.request_id = generation.request_id
                await generation.start(Job(params=params, messages=messages, cache_salt=salt))
                async for update in generation.updates():
                    text = "".join(c["text"] for c in update.chunks)
                    if text:
                        user.state, user.text = "streaming", user.text + text
                        await self._broadcast({"kind": "tokens", "user": user.user, "text": text})
                    if update.done is not None:
                        output = update.done["outputs"][0]
                        user.state, user.text = "done", output["text"]
                        user.usage, user.timing = update.done["usage"], update.done["timing"]
                        user.finish_reason = output["finish_reason"]
                        await self._broadcast({"kind": "user", "user": asdict(user)})
        except GenerationFailed as exc:
            user.state, user.error = "error", str(exc)
            await self._broadcast({"kind": "user", "user": asdict(user)})

    def request_names(self) -> dict[str, str]:
        """Request id -> simulated user's name, for this run's submitted requests (the demo's block view)."""
        users = self.run.users if self.run else []
        return {u.request_id: u.name for u in users if u.request_id}

    async def _broadcast(self, event: dict[str, Any]) -> None:
        try:
            await get_channel_layer().group_send(GROUP, {"type": "demo.event", "event": event})
        except Exception:  # a full or unreachable layer must not kill the run; watchers resync on connect
            logger.exception("could not broadcast a demo event")


runner = DemoRunner()
