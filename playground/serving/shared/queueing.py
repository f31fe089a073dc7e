"""Queue a generation's Celery task: the one send that the web side's dispatch and a draining worker handing a
task back both use, so the task's shape (name, kwargs, id) is written once."""
from typing import Any

from playground.celery import app as celery_app

from .naming import TASK_NAME


def send_generation(request_id: str, task: dict[str, Any], queue: str) -> None:
    """Queue `task` (`Job.to_task`'s JSON) on `queue` under the request's id (Celery's log lines name it too)."""
    celery_app.send_task(TASK_NAME, kwargs={"request_id": request_id, "job": task}, queue=queue, task_id=request_id)
