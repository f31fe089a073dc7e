"""Is a queued or running generation still going to finish? Shared by every web-side waiter (the chat
consumer, the OpenAI API, the demo), so a dead worker gives each of them an error, never a hang."""
import time
from dataclasses import dataclass, field

from django.conf import settings

from ..shared import registry
from ..shared.naming import GPU_QUEUE

CHECK_INTERVAL_S = 1.0


@dataclass
class Pending:
    """What a waiter knows about one generation it queued."""

    queue: str = GPU_QUEUE
    worker: str = ""  # set once a worker accepted it
    queued_at: float = field(default_factory=time.monotonic)


async def problem_with(pending: Pending) -> str | None:
    """Why the generation will never finish (its worker died, nobody picks it up), or None while it may."""
    if pending.worker:
        if await registry.aget(pending.worker) is None:
            return f"the GPU worker {pending.worker} stopped responding"
        return None
    waited = time.monotonic() - pending.queued_at
    if waited > settings.PLAYGROUND_ACCEPT_TIMEOUT:
        return "no GPU worker picked up the request in time"
    if waited > settings.PLAYGROUND_NO_WORKER_GRACE:
        workers = await registry.alive_workers()
        if not any(w["queue"] == pending.queue or pending.queue == GPU_QUEUE for w in workers):
            return "no GPU worker is running"
    return None
