"""Queue a generation's Celery task: the one send that the web side's dispatch and a draining worker handing a
task back both use, so the task's shape (name, kwargs, id) is written once.

In the embedded mode the GPU worker runs in this process, and it takes a generation onto its task threads itself
(`take_locally`, set by playground/serving/embedded.py) instead of through the broker and Celery's consumer: two
thread wake-ups fewer, 45-48 ms of a streamed request's first token outside the engine against 56-58
(`python -m bench.request_timeline`, bfloat16, 2 rounds alternating). What it does not take goes to Celery.

The task's headers carry a one-line summary of its arguments (`task_summary`), not Celery's own repr of them:
Celery walks the whole job (every message of the transcript) to write that repr for its logs and monitors,
which put users' chat text into every task's headers and cost a chat turn's publish 0.39 ms of CPU against
0.28 (200 sends to Redis, a chat page's job, AMD EPYC Zen 5). A burst's tasks go in one batch
(`send_generations`): one producer, one Redis client and one pipeline for all.
"""
from collections.abc import Callable, Sequence
from typing import Any

from playground.celery import app as celery_app

from .naming import TASK_NAME

LocalTaker = Callable[[str, dict[str, Any]], bool]  # (request id, task) -> whether it took the task
_local_taker: LocalTaker | None = None


def take_locally(taker: LocalTaker | None) -> None:
    """Offer every generation to `taker` first (this process's worker), or with None, to Celery alone again."""
    global _local_taker
    _local_taker = taker


def send_generation(request_id: str, task: dict[str, Any], queue: str) -> None:
    """Queue `task` (`Job.to_task`'s JSON) on `queue` under the request's id (Celery's log lines name it too),
    unless this process's worker takes it."""
    send_generations([(request_id, task, queue)])


def send_generations(sends: Sequence[tuple[str, dict[str, Any], str]]) -> None:
    """`send_generation` for each (request id, task, queue): what this process's worker does not take goes to the
    broker through one producer in one batch (kombu's: one Redis round trip for all). Raises what the broker
    raised; then none, some or all of the batch may have been queued, and a worker drops those whose request
    was aborted meanwhile."""
    taker = _local_taker
    rest = [send for send in sends if taker is None or not taker(send[0], send[1])]
    if not rest:
        return
    with celery_app.producer_or_acquire() as producer, producer.batch():
        for request_id, task, queue in rest:
            celery_app.send_task(TASK_NAME, kwargs={"request_id": request_id, "job": task}, queue=queue,
                                 task_id=request_id, ignore_result=True, argsrepr="()",
                                 kwargsrepr=task_summary(request_id, task), producer=producer)


def task_summary(request_id: str, task: dict[str, Any]) -> str:
    """What Celery's logs and monitors show of a generation task's arguments: its kind and size, never its text."""
    messages, prompt = task.get("messages"), task.get("prompt")
    if messages is not None:
        size = f"{len(messages)} messages"
    elif isinstance(prompt, list):
        size = f"a prompt of {len(prompt)} token ids"
    else:
        size = f"a prompt of {len(prompt or '')} characters"
    return f"request {request_id}: {task.get('kind', 'generate')}, {size}"
