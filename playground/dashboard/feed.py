"""The dashboard's channel-layer vocabulary, shared by the web side (consumers) and the GPU workers.

Workers send `kv.snapshot {snapshot}` to two groups: KV_GROUP gets full snapshots (the staff memory view),
SUMMARY_GROUP gets them without block map and requests (the chat page's panel). Web processes reach the
workers through the serving control group (every worker listens there): `kv.refresh` asks every worker
for a snapshot now (someone started watching), `kv.reset_prefix_cache {worker}` is for the named worker only.
"""
from typing import Any

from playground.serving.naming import CONTROL_GROUP

KV_GROUP = "kv"
SUMMARY_GROUP = "kv.summary"
SNAPSHOT = "kv.snapshot"
REFRESH = "kv.refresh"
RESET_PREFIX_CACHE = "kv.reset_prefix_cache"


async def watch(layer: Any, channel_name: str, group: str) -> None:
    """Join a snapshot group and ask every worker for a fresh snapshot, so a new viewer sees each worker
    at once even when it is idle (idle workers publish nothing)."""
    await layer.group_add(group, channel_name)
    await layer.group_send(CONTROL_GROUP, {"type": REFRESH})


async def reset_prefix_cache(layer: Any, worker: str) -> None:
    """Ask the named worker to drop its cached, unreferenced blocks."""
    await layer.group_send(CONTROL_GROUP, {"type": RESET_PREFIX_CACHE, "worker": worker})
