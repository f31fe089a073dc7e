"""Names shared by the web side and the workers: queues, channel-layer groups, the task."""
import re

GPU_QUEUE = "gpu"
CONTROL_GROUP = "gpu.control"  # every worker listens here for aborts
# The prefix of every channel a worker process receives on. channels_redis serves all channels of one prefix
# through one Redis list and one receive lock; channels of two prefixes in one process take turns on that
# lock, each blocking the other for up to its pop timeout (a reset or abort handled seconds late).
WORKER_CHANNEL_PREFIX = "gpu.control."
# The same rule in a web process: every channel it receives on (a request's, a feed's, the lab socket's own)
# has Channels' default prefix, the one a consumer's own channel gets. With a second prefix, an idle memory
# view's feed held that lock for its 5 s pop while chat tokens waited (the fault suite caught it).
WEB_CHANNEL_PREFIX = "specific."
TASK_NAME = "serving.generate"
# A worker's message carrying several requests' events for one web process: {"type": BATCH, "events": [...]}
# (worker/coalesce.py sends it, web/inbox.py unpacks it).
BATCH = "gen.batch"
# What a lab page may ask of its sandbox (playground.lab relays them; the worker's lab_host runs them).
LAB_COMMANDS = ("open", "add", "step", "abort", "answer", "recording", "close")


def worker_queue(worker_name: str) -> str:
    """The private queue of one worker: follow-up turns routed here find the history in its prefix cache."""
    return f"{GPU_QUEUE}.{worker_name}"


def lab_worker_group(worker_name: str) -> str:
    """The group on which one worker receives the commands of the labs it hosts (worker names such as
    "embedded@host" hold characters a group name may not)."""
    return "lab.worker." + re.sub(r"[^A-Za-z0-9_.-]", "-", worker_name)


def lab_group(lab_id: str) -> str:
    """The group a lab page's consumer joins; the hosting worker sends the lab's replies there."""
    return f"lab.{lab_id}"
