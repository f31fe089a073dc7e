"""Web side of serving: hand a generation to a GPU worker through Celery, or abort one.

Never imports the engine: the web process only talks to Celery and the channel layer.
"""
from channels.layers import get_channel_layer

from ..shared import registry
from ..shared.envelope import Job
from ..shared.naming import CONTROL_GROUP, GPU_QUEUE, worker_queue
from ..shared.queueing import send_generation


def choose_queue(preferred_worker: str) -> str:
    """Prefix-aware routing: the worker that served the conversation's last turn, if it is alive and not
    already queueing work; any worker (the shared queue) otherwise."""
    heartbeat = registry.get(preferred_worker)
    if heartbeat is None or heartbeat.get("state") != "ready":
        return GPU_QUEUE
    if heartbeat.get("metrics", {}).get("num_requests_waiting", 0) > 0:
        return GPU_QUEUE
    return worker_queue(preferred_worker)


def submit(request_id: str, job: Job) -> str:
    """Queue the generation task (blocking: call through sync_to_async); returns the queue it went to."""
    queue = choose_queue(job.preferred_worker)
    send_generation(request_id, job.to_task(), queue)
    return queue


async def abort(request_id: str) -> None:
    """Ask every worker to abort this request; the one running it frees its blocks, a worker that has not
    picked it up yet drops it when it does."""
    await get_channel_layer().group_send(CONTROL_GROUP, {"type": "gen.abort", "request_id": request_id})
