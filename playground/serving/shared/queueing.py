"""Queue a generation's Celery task: the one send that the web side's dispatch and a draining worker handing a
task back both use, so the task's shape (name, kwargs, id) is written once.

In the embedded mode the GPU worker runs in this process, and it takes a generation onto its task threads itself
(`take_locally`, set by playground/serving/embedded.py) instead of through the broker and Celery's consumer: two
thread wake-ups fewer, 45-48 ms of a streamed request's first token outside the engine against 56-58
(`python -m bench.request_timeline`, bfloat16, 2 rounds alternating). What it does not take goes to Celery.
"""
from collections.abc import Callable
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
    taker = _local_taker
    if taker is not None and taker(request_id, task):
        return
    celery_app.send_task(TASK_NAME, kwargs={"request_id": request_id, "job": task}, queue=queue, task_id=request_id)
