"""Web side of serving: hand a generation to a GPU worker through Celery, or abort one.

Never imports the engine: the web process only talks to Celery and the channel layer. A burst's tasks go to the
broker together (`submit` batches them per event loop, serving.web.batching): one thread call, one registry read
and one Redis round trip for every task queued while the last batch was being sent.
"""
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from ..shared import registry
from ..shared.envelope import Job
from ..shared.naming import CONTROL_GROUP, GPU_QUEUE, worker_queue
from ..shared.queueing import send_generations
from .batching import Batcher, per_loop


def choose_queues(preferred_workers: list[str]) -> list[str]:
    """Prefix-aware routing, for each request: the worker that served the conversation's last turn, if it is alive
    and not already queueing work; any worker (the shared queue) otherwise."""
    heartbeats = registry.get_many(preferred_workers)
    queues = []
    for name in preferred_workers:
        heartbeat = heartbeats.get(name)
        ready = heartbeat is not None and heartbeat.get("state") == "ready"
        idle = ready and heartbeat.get("metrics", {}).get("num_requests_waiting", 0) == 0
        queues.append(worker_queue(name) if idle else GPU_QUEUE)
    return queues


def submit_many(jobs: list[tuple[str, Job]]) -> list[str]:
    """Queue each (request id, job)'s task (blocking: the batcher runs it in a thread); returns their queues."""
    queues = choose_queues([job.preferred_worker for _, job in jobs])
    send_generations([(request_id, job.to_task(), queue) for (request_id, job), queue in zip(jobs, queues)])
    return queues


async def _send(jobs: list[tuple[str, Job]]) -> list[str]:
    return await sync_to_async(submit_many, thread_sensitive=False)(jobs)


_sender = per_loop(lambda: Batcher(_send))


async def submit(request_id: str, job: Job) -> str:
    """Queue the generation task with the others of its burst; returns the queue it went to. Raises what the
    broker raised for its batch (the whole batch fails together)."""
    return await _sender().submit((request_id, job))


async def abort(request_id: str) -> None:
    """Ask every worker to abort this request; the one running it frees its blocks, a worker that has not
    picked it up yet drops it when it does."""
    await get_channel_layer().group_send(CONTROL_GROUP, {"type": "gen.abort", "request_id": request_id})
