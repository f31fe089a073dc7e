"""The Celery task on queue `gpu`: hand one request to this worker's long-lived engine."""
from typing import Any

from celery import shared_task

from . import runtime
from ..shared.envelope import Job
from ..shared.naming import GPU_QUEUE, TASK_NAME
from ..shared.queueing import send_generation


@shared_task(name=TASK_NAME, ignore_result=True)
def generate(request_id: str, job: dict[str, Any]) -> None:
    """Blocks this task thread until the request ends; tokens flow through the channel layer, not here.
    `job` is the request envelope (`Job.to_task`). A draining worker passes the task back to the shared queue
    (`WorkerRuntime.passes_on_new_work`), where another worker takes it, as dispatch would route it now."""
    worker = runtime.current()
    if worker.passes_on_new_work():
        send_generation(request_id, job, GPU_QUEUE)
        return
    worker.serve(request_id, Job.from_task(job))
