"""The dashboard's channel-layer vocabulary, shared by the web side (consumers) and the GPU workers.

Workers send `kv.snapshot {snapshot}` to two groups: KV_GROUP gets full snapshots (the staff memory view),
SUMMARY_GROUP gets them without block map and requests (the chat page's panel). Web processes reach the
workers through the serving control group (every worker listens there): `kv.refresh {watch}` asks every
worker for a snapshot now (someone started watching), `kv.watch` renews a memory view's lease, and
`kv.reset_prefix_cache {worker}` is for the named worker only, and so is `kv.record {worker, action}`: it starts or
stops a recording of the worker's engine events (inference/events.py); a stopped recording is kept in the
cache under `recording_key(worker)` for the memory view to download and the lab to replay, and the worker
says so with `kv.recording` on KV_GROUP.

Full snapshots cost a worker a pass over its whole block pool, so workers build them only while a memory
view holds a lease: `kv.refresh` with `watch: true`, renewed by `kv.watch` every WATCH_RENEW_S, lasting
WATCH_LEASE_S. Without one they publish summaries only.
"""
import asyncio
import logging
from typing import Any

from playground.serving.shared.naming import CONTROL_GROUP

logger = logging.getLogger(__name__)

KV_GROUP = "kv"
SUMMARY_GROUP = "kv.summary"
SNAPSHOT = "kv.snapshot"
REFRESH = "kv.refresh"
WATCH = "kv.watch"
RESET_PREFIX_CACHE = "kv.reset_prefix_cache"
RECORD = "kv.record"  # {worker, action: "start" | "stop"}: for the named worker only
RECORDING = "kv.recording"  # {worker, state, events, truncated}: a worker's answer, to KV_GROUP
RECORDING_LIMIT = 200_000  # events kept by one live recording
RECORDING_TTL_S = 3600  # a stopped recording waits this long in the cache to be downloaded
WATCH_RENEW_S = 10.0
WATCH_LEASE_S = 3 * WATCH_RENEW_S  # a lease outlives two lost renewals


async def ask_for_snapshots(layer: Any, full: bool) -> None:
    """Ask every worker for a fresh snapshot, so a viewer that just joined a snapshot group sees each worker
    at once even when it is idle (idle workers publish nothing); `full` also takes a watch lease."""
    await layer.group_send(CONTROL_GROUP, {"type": REFRESH, "watch": full})


async def renew(layer: Any) -> None:
    """Renew the watch lease of a memory view that is still open."""
    await layer.group_send(CONTROL_GROUP, {"type": WATCH})


async def keep_watching(layer: Any) -> None:
    """Renew the watch lease for as long as this task runs (cancel it when the viewer leaves), so the workers
    keep building full snapshots."""
    while True:
        await asyncio.sleep(WATCH_RENEW_S)
        try:
            await renew(layer)
        except Exception:  # the layer is down: try again next round; the lease outlives two misses
            logger.exception("could not renew a watch lease")


def recording_key(worker: str) -> str:
    return f"playground:recording:{worker}"


async def record(layer: Any, worker: str, action: str) -> None:
    """Ask the named worker to start or stop recording its engine's events."""
    await layer.group_send(CONTROL_GROUP, {"type": RECORD, "worker": worker, "action": action})


async def reset_prefix_cache(layer: Any, worker: str) -> None:
    """Ask the named worker to drop its cached, unreferenced blocks."""
    await layer.group_send(CONTROL_GROUP, {"type": RESET_PREFIX_CACHE, "worker": worker})
