"""Can a queued or running generation still finish? Asked by the request lifecycle (lifecycle.py) whenever
nothing arrived for a while, so that every accepted request ends with its reply or an error, never a hang.

It cannot finish when:
- its deadline passed (`PLAYGROUND_REQUEST_DEADLINE_S` after admission): "timeout";
- no worker picked it up within `PLAYGROUND_ACCEPT_TIMEOUT`, or no worker serves its queue at all for
  `PLAYGROUND_NO_WORKER_GRACE` seconds: "unavailable";
- the worker that accepted it stopped heart-beating, or reports its engine loop unhealthy: "unavailable";
- its reply was lost: the worker's heartbeats (which list the requests it is serving, from before
  `gen.accepted` until after `gen.done`) have not listed it for `PLAYGROUND_LOST_REPLY_GRACE` seconds
  while no `gen.done` came — the channel layer dropped it (a Redis restart, an expired message): "unavailable".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.conf import settings

from ..shared import registry
from ..shared.naming import GPU_QUEUE

CHECK_INTERVAL_S = 1.0


@dataclass
class Progress:
    """What the lifecycle knows about where its request is."""

    deadline: float  # time.monotonic() after which the request fails
    queue: str = GPU_QUEUE
    queued_at: float = field(default_factory=time.monotonic)
    unlisted_since: float | None = None  # first check at which the accepting worker did not list it

    def past_deadline(self) -> tuple[str, str] | None:
        if time.monotonic() > self.deadline:
            return f"the request did not finish within {settings.PLAYGROUND_REQUEST_DEADLINE_S} s", "timeout"
        return None


async def problem_with(progress: Progress, worker: str, request_id: str) -> tuple[str, str] | None:
    """(why the request will never finish, error code), or None while it may."""
    if (late := progress.past_deadline()) is not None:
        return late
    now = time.monotonic()
    if worker:
        heartbeat = await registry.aget(worker)
        if heartbeat is None:
            return f"the GPU worker {worker} stopped responding", "unavailable"
        if heartbeat.get("state") == "failed":  # a loading worker still serves it once loaded
            error = (heartbeat.get("health") or {}).get("error") or heartbeat.get("state")
            return f"the GPU worker {worker} cannot serve: {error}", "unavailable"
        if request_id in heartbeat.get("requests", ()):
            progress.unlisted_since = None
        elif progress.unlisted_since is None:
            progress.unlisted_since = now
        elif now - progress.unlisted_since > settings.PLAYGROUND_LOST_REPLY_GRACE:
            return f"the reply was lost: the GPU worker {worker} is no longer serving this request", "unavailable"
        return None
    waited = now - progress.queued_at
    if waited > settings.PLAYGROUND_ACCEPT_TIMEOUT:
        return "no GPU worker picked up the request in time", "unavailable"
    if waited > settings.PLAYGROUND_NO_WORKER_GRACE:
        workers = [w for w in await registry.alive_workers() if w.get("state") != "failed"]
        if not any(w["queue"] == progress.queue or progress.queue == GPU_QUEUE for w in workers):
            return "no GPU worker is running", "unavailable"
    return None
