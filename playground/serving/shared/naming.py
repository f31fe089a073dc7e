"""Names shared by the web side and the workers: queues, channel-layer groups, the task."""

GPU_QUEUE = "gpu"
CONTROL_GROUP = "gpu.control"  # every worker listens here for aborts
TASK_NAME = "serving.generate"


def worker_queue(worker_name: str) -> str:
    """The private queue of one worker: follow-up turns routed here find the history in its prefix cache."""
    return f"{GPU_QUEUE}.{worker_name}"


def request_group(request_id: str) -> str:
    """Channel-layer group a request's consumer joins and its worker sends to."""
    return f"req.{request_id}"
