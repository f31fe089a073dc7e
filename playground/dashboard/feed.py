"""The dashboard's channel-layer vocabulary, shared by the web side (consumers) and the GPU workers.

Workers send `kv.snapshot {snapshot}` to two groups: KV_GROUP gets full snapshots (the staff memory view),
SUMMARY_GROUP gets them without block map and requests (the chat page's panel). Web processes reach the
workers through the serving control group (every worker listens there): `kv.refresh {watch}` asks every
worker for a snapshot now (someone started watching), `kv.watch` renews a memory view's lease, and
`kv.reset_prefix_cache {worker}` is for the named worker only.

Full snapshots cost a worker a pass over its whole block pool, so workers build them only while a memory
view holds a lease: `kv.refresh` with `watch: true`, renewed by `kv.watch` every WATCH_RENEW_S, lasting
WATCH_LEASE_S. Without one they publish summaries only.
"""
from typing import Any

from playground.serving.shared.naming import CONTROL_GROUP

KV_GROUP = "kv"
SUMMARY_GROUP = "kv.summary"
SNAPSHOT = "kv.snapshot"
REFRESH = "kv.refresh"
WATCH = "kv.watch"
RESET_PREFIX_CACHE = "kv.reset_prefix_cache"
WATCH_RENEW_S = 10.0
WATCH_LEASE_S = 3 * WATCH_RENEW_S  # a lease outlives two lost renewals


async def watch(layer: Any, channel_name: str, group: str, full: bool) -> None:
    """Join a snapshot group and ask every worker for a fresh snapshot, so a new viewer sees each worker
    at once even when it is idle (idle workers publish nothing); `full` also takes a watch lease."""
    await layer.group_add(group, channel_name)
    await layer.group_send(CONTROL_GROUP, {"type": REFRESH, "watch": full})


async def renew(layer: Any) -> None:
    """Renew the watch lease of a memory view that is still open."""
    await layer.group_send(CONTROL_GROUP, {"type": WATCH})


async def reset_prefix_cache(layer: Any, worker: str) -> None:
    """Ask the named worker to drop its cached, unreferenced blocks."""
    await layer.group_send(CONTROL_GROUP, {"type": RESET_PREFIX_CACHE, "worker": worker})
