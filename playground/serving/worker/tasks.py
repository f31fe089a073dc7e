"""The Celery task on queue `gpu`: hand one request to this worker's long-lived engine."""
from typing import Any

from celery import shared_task

from . import runtime
from ..shared.envelope import Job
from ..shared.naming import TASK_NAME


@shared_task(name=TASK_NAME, ignore_result=True)
def generate(request_id: str, job: dict[str, Any]) -> None:
    """Blocks this task thread until the request ends; tokens flow through the channel layer, not here.
    `job` is the request envelope (`Job.to_task`)."""
    runtime.current().serve(request_id, Job.from_task(job))
